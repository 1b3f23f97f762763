"""The programs: the `samtone` command line, its modes, the demo and the gin registry."""
