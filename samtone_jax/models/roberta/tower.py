"""The RoBERTa encoder stack (RoBERTa, XLM-RoBERTa) in Flax Linen, with Hugging Face `RobertaModel` /
`XLMRobertaModel` semantics (tested against both).

RoBERTa is BERT's encoder (models/bert/tower.py's layers and LayerNorm, reused as is) with two
differences, both in the embeddings:

  positions   counted from the padding index + 1 (2: transformers' create_position_ids_from_input_ids),
              padding tokens at position 1, so a text reads at most max_position_embeddings − 2 tokens;
  vocabulary  <s> 0, <pad> 1, </s> 2: the tokenizer (data/wordpiece_tokens.py) and the importer swap ids
              0 and 1 (the family's hf_pad_id), so 0 pads here as in every tower.

One token type (type_vocab_size 1 in RoBERTa and XLM-R): row 0 is added to every token. Packed rows
(segment_ids): each text's positions restart at 2, attention stays within the text.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from samtone_jax.core.errors import BadValueError
from samtone_jax.models.bert.tower import BertConfig, EncoderLayer, LayerNorm, text_layout
from samtone_jax.models.layer_stack import apply_layers
from samtone_jax.models.layers import param

_INIT = nn.initializers.truncated_normal(0.02)
FIRST_POSITION = 2  # the padding index (1) + 1


@dataclasses.dataclass(frozen=True)
class RobertaConfig(BertConfig):
    """BertConfig's fields with RoBERTa-base's defaults, except max_length: the longest input in
    tokens (max_position_embeddings − 2: positions start at 2)."""

    vocab_size: int = 50265
    emb_dim: int = 768
    num_heads: int = 12
    num_layers: int = 12
    head_dim: int = 64
    mlp_dim: int = 3072
    max_length: int = 512
    type_vocab_size: int = 1
    layer_norm_epsilon: float = 1e-5

    @property
    def positions(self) -> int:
        """The position table's rows (Hugging Face's max_position_embeddings)."""
        return self.max_length + FIRST_POSITION


class RobertaEncoder(nn.Module):
    """Token ids [B, L] (0 = padding) -> final hidden states [B, L, emb_dim]; padding keys masked.
    `segment_ids` [B, L]: packed rows; `adapter`: a LoRA adapter's factors (as BertEncoder)."""

    config: RobertaConfig

    @nn.compact
    def __call__(
        self, tokens: jax.Array, deterministic: bool = True, segment_ids: jax.Array | None = None, adapter=None
    ):
        cfg = self.config
        if tokens.ndim != 2:
            raise BadValueError(f"RobertaEncoder expects token ids [batch, length], got shape {tokens.shape}")
        if tokens.shape[1] > cfg.max_length:
            raise BadValueError(
                f"texts of {tokens.shape[1]} tokens, but the RoBERTa tower reads at most {cfg.max_length} "
                "(RobertaConfig.max_length): lower train.query_length / train.doc_length"
            )
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        words = param(self, "token_embedder", _INIT, (cfg.vocab_size, cfg.emb_dim), ("vocab", "embed"), pdtype)
        places = param(self, "position_embedder", _INIT, (cfg.positions, cfg.emb_dim), ("positions", "embed"), pdtype)
        types = param(
            self, "token_type_embedder", _INIT, (cfg.type_vocab_size, cfg.emb_dim), ("token_types", "embed"), pdtype
        )
        padding, positions, masked = text_layout(tokens, segment_ids)
        positions = jnp.where(padding, FIRST_POSITION - 1, positions + FIRST_POSITION)
        x = jnp.take(words, tokens, axis=0).astype(jnp.float32) + jnp.take(places, positions, axis=0).astype(
            jnp.float32
        )
        x = x + types[0].astype(jnp.float32)
        x = LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, cfg.param_dtype, name="embedding_layer_norm")(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        bias = jnp.where(masked, jnp.float32(-1e10), jnp.float32(0.0))
        return apply_layers(self, EncoderLayer, cfg, x.astype(dtype), bias, deterministic, adapter)
