"""The ModernBERT tower family: the encoder (tower.py), its Hugging Face names (hf_names.py), its
record (family.py)."""

from samtone_jax.models.modernbert.tower import ModernBertConfig, ModernBertEncoder

__all__ = ["ModernBertConfig", "ModernBertEncoder"]
