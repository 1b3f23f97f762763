"""Models and losses from gin text: the configurable parts, the gin search path, parsing with clear errors."""
