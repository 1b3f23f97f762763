"""samtone_jax: dual-encoder retrieval training in JAX/Flax (T5.1.1 towers, SamToNe loss)."""

__version__ = "0.1.0"


def load(path: str, **kwargs):
    """A trained dual encoder with `encode_queries(texts)` / `encode_documents(texts)` -> np.ndarray
    (see samtone_jax.inference.load for `path` and the keyword arguments)."""
    from samtone_jax.inference import load as _load

    return _load(path, **kwargs)
