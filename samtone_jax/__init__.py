"""samtone_jax: dual-encoder retrieval training in JAX/Flax (T5.1.1 towers, SamToNe loss)."""

from samtone_jax.core import run_clock  # noqa: F401, I001  (first: the time to first step counts the imports)
from samtone_jax.core import paths, xla_cpu_flags  # noqa: F401  (paths: the storage backends, chosen on import)
from samtone_jax.version import __version__  # noqa: F401

# Before JAX reads XLA_FLAGS: simulated CPU devices must not reorder collectives (see xla_cpu_flags).
xla_cpu_flags.apply()


def load(path: str, **kwargs):
    """A trained dual encoder with `encode_queries(texts)` / `encode_documents(texts)` -> np.ndarray
    (see samtone_jax.inference.encoder.load_encoder for `path` and the keyword arguments)."""
    from samtone_jax.inference.encoder import load_encoder

    return load_encoder(path, **kwargs)
