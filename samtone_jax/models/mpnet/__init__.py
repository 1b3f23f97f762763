"""The MPNet tower family (all-mpnet-base-v2): the encoder (tower.py), its Hugging Face names
(hf_names.py), its record (family.py)."""

from samtone_jax.models.mpnet.tower import MPNetConfig, MPNetEncoder

__all__ = ["MPNetConfig", "MPNetEncoder"]
