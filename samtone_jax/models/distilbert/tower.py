"""The DistilBERT encoder stack in Flax Linen, with Hugging Face `DistilBertModel` semantics (tested
against it): BERT's post-LayerNorm layers (models/bert/tower.py's, reused as is: the same math under
other names, hf_names.py) over word + absolute position embeddings, without token types, LayerNorm
epsilon 1e-12 everywhere (transformers fixes it). Packed rows as BertEncoder."""

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


@dataclasses.dataclass(frozen=True)
class DistilBertConfig(BertConfig):
    """BertConfig's fields with distilbert-base's defaults (Hugging Face's names: dim, n_layers,
    n_heads, hidden_dim, max_position_embeddings, dropout, attention_dropout); no token types."""

    vocab_size: int = 30522
    emb_dim: int = 768
    num_heads: int = 12
    num_layers: int = 6
    head_dim: int = 64
    mlp_dim: int = 3072
    max_length: int = 512
    type_vocab_size: int = 1  # unused: DistilBERT has no token-type table
    layer_norm_epsilon: float = 1e-12


class DistilBertEncoder(nn.Module):
    """Token ids [B, L] (0 = [PAD]) -> final hidden states [B, L, emb_dim]; padding keys masked.
    `segment_ids` [B, L]: packed rows; `adapter`: a LoRA adapter's factors (as BertEncoder)."""

    config: DistilBertConfig

    @nn.compact
    def __call__(
        self, tokens: jax.Array, deterministic: bool = True, segment_ids: jax.Array | None = None, adapter=None
    ):
        cfg = self.config
        if tokens.ndim != 2:
            raise BadValueError(f"DistilBertEncoder expects token ids [batch, length], got shape {tokens.shape}")
        if tokens.shape[1] > cfg.max_length:
            raise BadValueError(
                f"texts of {tokens.shape[1]} tokens, but the DistilBERT tower has {cfg.max_length} positions "
                "(DistilBertConfig.max_length): lower train.query_length / train.doc_length"
            )
        pdtype = jnp.dtype(cfg.param_dtype)
        words = param(self, "token_embedder", _INIT, (cfg.vocab_size, cfg.emb_dim), ("vocab", "embed"), pdtype)
        places = param(self, "position_embedder", _INIT, (cfg.max_length, cfg.emb_dim), ("positions", "embed"), pdtype)
        _, positions, masked = text_layout(tokens, segment_ids)
        x = jnp.take(words, tokens, axis=0).astype(jnp.float32) + jnp.take(places, positions, axis=0).astype(
            jnp.float32
        )
        x = LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, cfg.param_dtype, name="embedding_layer_norm")(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        bias = jnp.where(masked, jnp.float32(-1e10), jnp.float32(0.0))
        return apply_layers(self, EncoderLayer, cfg, x.astype(jnp.dtype(cfg.dtype)), bias, deterministic, adapter)
