"""Encoder towers (T5.1.1, BERT) and the dual encoders built from them."""

from samtone_jax.models.bert import BertConfig, BertEncoder
from samtone_jax.models.dual_encoder import ARCHITECTURES, DualEncoder, init_params, l2_normalize, mean_pool
from samtone_jax.models.layers import PAD_ID
from samtone_jax.models.t5 import T5Config, T5Encoder

__all__ = [
    "ARCHITECTURES",
    "PAD_ID",
    "BertConfig",
    "BertEncoder",
    "DualEncoder",
    "T5Config",
    "T5Encoder",
    "init_params",
    "l2_normalize",
    "mean_pool",
]
