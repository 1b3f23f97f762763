"""The RoBERTa tower family (RoBERTa, XLM-RoBERTa): the encoder (tower.py), its Hugging Face names
(hf_names.py), its record (family.py)."""

from samtone_jax.models.roberta.tower import RobertaConfig, RobertaEncoder

__all__ = ["RobertaConfig", "RobertaEncoder"]
