"""The T5.1.1 tower family: the encoder (tower.py), its Hugging Face names (hf_names.py), its record
(family.py)."""

from samtone_jax.models.t5.tower import T5Config, T5Encoder, relative_position_bucket

__all__ = ["T5Config", "T5Encoder", "relative_position_bucket"]
