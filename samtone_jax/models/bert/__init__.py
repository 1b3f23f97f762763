"""The BERT tower family: the encoder (tower.py), its Hugging Face names (hf_names.py), its record
(family.py)."""

from samtone_jax.models.bert.tower import BertConfig, BertEncoder, segment_positions

__all__ = ["BertConfig", "BertEncoder", "segment_positions"]
