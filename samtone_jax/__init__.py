"""samtone_jax: dual-encoder retrieval training in JAX/Flax (T5.1.1 towers, SamToNe loss)."""

__version__ = "0.1.0"
