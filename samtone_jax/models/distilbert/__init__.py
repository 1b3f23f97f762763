"""The DistilBERT tower family: the encoder (tower.py), its Hugging Face names (hf_names.py), its
record (family.py)."""

from samtone_jax.models.distilbert.tower import DistilBertConfig, DistilBertEncoder

__all__ = ["DistilBertConfig", "DistilBertEncoder"]
