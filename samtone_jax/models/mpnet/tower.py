"""The MPNet encoder stack in Flax Linen, with Hugging Face `MPNetModel` semantics (tested against it).

MPNet is BERT's post-LayerNorm encoder (models/bert/tower.py's layer, reused as is) with three
differences:

  embeddings  word + absolute position, no token types; positions count from the padding index + 1
              (2: transformers' create_position_ids_from_input_ids), padding tokens sit at position 1;
  attention   one relative-position bias table [heads, 32 buckets] shared by every layer and added to
              the scaled scores: T5's bidirectional buckets (max distance 128) of key − query,
              which is why models/t5's bucket function is used as is (tested equal to
              transformers' on every distance up to 2,048);
  vocabulary  <s> 0, <pad> 1, </s> 2: the tokenizer (data/wordpiece_tokens.py) and the importer swap
              ids 0 and 1 (the family's hf_pad_id), so 0 pads here as in every tower.

Packed rows (segment_ids, as BertEncoder): each text's absolute positions restart at 2, and its
relative bias is that of key − query inside the text, which the row's own offsets give unchanged
(a text is a contiguous run), so each packed text's hidden states are the ones it gets alone.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from samtone_jax.core.errors import BadValueError
from samtone_jax.models.bert.tower import EncoderLayer, LayerNorm, text_layout
from samtone_jax.models.layer_stack import apply_layers
from samtone_jax.models.layers import param
from samtone_jax.models.t5.tower import relative_position_bucket

_INIT = nn.initializers.truncated_normal(0.02)
BUCKETS = 32  # transformers buckets into 32 whatever relative_attention_num_buckets says
MAX_DISTANCE = 128
FIRST_POSITION = 2  # the padding index (1) + 1


@dataclasses.dataclass(frozen=True)
class MPNetConfig:
    """Hyper-parameters of an MPNet encoder; names as BertConfig (Hugging Face's in brackets), except
    max_length: the longest input in tokens (max_position_embeddings − 2: positions start at 2)."""

    vocab_size: int = 30527
    emb_dim: int = 768
    num_heads: int = 12
    num_layers: int = 12
    head_dim: int = 64
    mlp_dim: int = 3072
    max_length: int = 512
    relative_attention_num_buckets: int = BUCKETS
    layer_norm_epsilon: float = 1e-5
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    scan_layers: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "emb_dim", "num_heads", "num_layers", "head_dim", "mlp_dim", "max_length"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise BadValueError(f"MPNetConfig.{name} must be a positive integer, got {value!r}")
        if self.relative_attention_num_buckets != BUCKETS:
            raise BadValueError(
                f"MPNetConfig.relative_attention_num_buckets = {self.relative_attention_num_buckets}: MPNet "
                f"(transformers' MPNetModel) buckets relative positions into {BUCKETS}"
            )
        for name in ("dropout_rate", "attention_dropout_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise BadValueError(f"MPNetConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.num_heads * self.head_dim != self.emb_dim:
            raise BadValueError(
                f"MPNetConfig.num_heads × head_dim = {self.num_heads} × {self.head_dim} must equal emb_dim = "
                f"{self.emb_dim}"
            )
        for name in ("dtype", "param_dtype"):
            jnp.dtype(getattr(self, name))

    @property
    def positions(self) -> int:
        """The position table's rows (Hugging Face's max_position_embeddings)."""
        return self.max_length + FIRST_POSITION


class MPNetEncoder(nn.Module):
    """Token ids [B, L] (0 = padding) -> final hidden states [B, L, emb_dim]; padding keys masked.
    `segment_ids` [B, L]: packed rows; `adapter`: a LoRA adapter's factors (as BertEncoder)."""

    config: MPNetConfig

    @nn.compact
    def __call__(
        self, tokens: jax.Array, deterministic: bool = True, segment_ids: jax.Array | None = None, adapter=None
    ):
        cfg = self.config
        if tokens.ndim != 2:
            raise BadValueError(f"MPNetEncoder expects token ids [batch, length], got shape {tokens.shape}")
        length = tokens.shape[1]
        if length > cfg.max_length:
            raise BadValueError(
                f"texts of {length} tokens, but the MPNet tower reads at most {cfg.max_length} "
                "(MPNetConfig.max_length): lower train.query_length / train.doc_length"
            )
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        words = param(self, "token_embedder", _INIT, (cfg.vocab_size, cfg.emb_dim), ("vocab", "embed"), pdtype)
        places = param(self, "position_embedder", _INIT, (cfg.positions, cfg.emb_dim), ("positions", "embed"), pdtype)
        table = param(
            self, "relative_position_table", _INIT, (cfg.num_heads, BUCKETS), ("heads", "relpos_buckets"), pdtype
        )
        padding, positions, masked = text_layout(tokens, segment_ids)
        positions = jnp.where(padding, FIRST_POSITION - 1, positions + FIRST_POSITION)
        x = jnp.take(words, tokens, axis=0).astype(jnp.float32) + jnp.take(places, positions, axis=0).astype(
            jnp.float32
        )
        x = LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, cfg.param_dtype, name="embedding_layer_norm")(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        relative = np.arange(length)[None, :] - np.arange(length)[:, None]  # key − query, static
        buckets = relative_position_bucket(relative, BUCKETS, MAX_DISTANCE)
        position_bias = table.astype(jnp.float32)[:, buckets][None]  # [1, heads, L, L]
        bias = jnp.where(masked, jnp.float32(-1e10), position_bias)
        return apply_layers(self, EncoderLayer, cfg, x.astype(dtype), bias, deterministic, adapter)
