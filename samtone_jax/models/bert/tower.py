"""The BERT encoder stack in Flax Linen, with Hugging Face `BertModel` semantics (tested against it).

  embeddings  word + absolute position + token type (always type 0: one text per input), then
              LayerNorm and dropout;
  each layer  post-LayerNorm: x = LN(x + Attention(x)), x = LN(x + W_o·gelu(W_i·x + b_i) + b_o),
              scaled dot-product attention (1/sqrt(head_dim)), biases everywhere, exact (erf) GELU,
              the config's epsilon; LayerNorm computed in float32.

The pooler (a tanh layer over [CLS]) is not part of a mean-pooling sentence encoder and is not kept.
Parameters are boxed with logical axis names like T5's (`embed`, `mlp`, `heads`, `kv`, `vocab`), so
the same partitioning rules (and FSDP) apply.

Packed rows (T5X's convention, as T5Encoder): `segment_ids` [B, L] numbers a row's texts 1, 2, ...
(0 = padding), each text a contiguous run. A token attends only to its own text and its absolute
position restarts at 0 in every run, so each text's hidden states are the ones it gets alone.

"BERT-family" here means the `BertModel` architecture (model_type 'bert': BERT, MiniLM, the
sentence-transformers all-*-MiniLM / BGE-small-style models). RoBERTa (positions offset by the
padding id), MPNet and models with relative positions are refused by the importer, naming why.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from samtone_jax.core.errors import BadValueError
from samtone_jax.models.dense import dense as _dense
from samtone_jax.models.dense import low_rank, sub
from samtone_jax.models.layer_stack import apply_layers
from samtone_jax.models.layers import ACTIVATION_AXES, PAD_ID, attend, param

# BERT's initialiser (Hugging Face's `initializer_range`).
_INIT = nn.initializers.truncated_normal(0.02)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT encoder. Field names follow T5Config where the idea is the same
    (Hugging Face's name in brackets): emb_dim (hidden_size), num_layers (num_hidden_layers),
    num_heads (num_attention_heads), head_dim (hidden_size / num_attention_heads), mlp_dim
    (intermediate_size), max_length (max_position_embeddings), type_vocab_size, layer_norm_epsilon
    (layer_norm_eps), dropout_rate (hidden_dropout_prob), attention_dropout_rate
    (attention_probs_dropout_prob)."""

    vocab_size: int = 30522
    emb_dim: int = 384
    num_heads: int = 12
    num_layers: int = 6
    head_dim: int = 32
    mlp_dim: int = 1536
    max_length: int = 512
    type_vocab_size: int = 2
    layer_norm_epsilon: float = 1e-12
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    dtype: str = "float32"  # activations; 'bfloat16' on TPU
    param_dtype: str = "float32"
    remat: bool = False  # as T5Config.remat
    scan_layers: bool = False  # as T5Config.scan_layers

    def __post_init__(self):
        for name in ("vocab_size", "emb_dim", "num_heads", "num_layers", "head_dim", "mlp_dim", "max_length"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise BadValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.type_vocab_size < 1:
            raise BadValueError(f"BertConfig.type_vocab_size must be ≥ 1, got {self.type_vocab_size}")
        for name in ("dropout_rate", "attention_dropout_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise BadValueError(f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.num_heads * self.head_dim != self.emb_dim:
            raise BadValueError(
                f"BertConfig.num_heads × head_dim = {self.num_heads} × {self.head_dim} must equal emb_dim = "
                f"{self.emb_dim} (BERT's attention output is hidden_size wide)"
            )
        for name in ("dtype", "param_dtype"):
            jnp.dtype(getattr(self, name))  # raises TypeError naming the bad dtype


class LayerNorm(nn.Module):
    """(x − mean) / sqrt(var + eps) · scale + bias over the last axis, computed in float32."""

    epsilon: float
    dtype: str = "float32"
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, x):
        x = x.astype(jnp.float32)
        features = (x.shape[-1],)
        scale = param(self, "scale", nn.initializers.ones, features, ("embed",), jnp.dtype(self.param_dtype))
        bias = param(self, "bias", nn.initializers.zeros, features, ("embed",), jnp.dtype(self.param_dtype))
        mean = jnp.mean(x, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(variance + self.epsilon)
        return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(jnp.dtype(self.dtype))


def _dense_with_bias(module, name, x, shape, axes, dtype, pdtype, in_dims: int = 1, adapter=None):
    """x · kernel + bias (+ the LoRA adapter's low-rank term for `name`); `shape` the kernel's (its
    first `in_dims` dimensions are the input)."""
    kernel = param(module, f"{name}_kernel", _INIT, shape, axes, pdtype)
    bias = param(module, f"{name}_bias", nn.initializers.zeros, shape[in_dims:], axes[in_dims:], pdtype)
    y = _dense(x.astype(dtype), kernel.astype(dtype), in_dims) + low_rank(x, adapter, name, dtype, in_dims)
    return y + bias.astype(dtype)


class SelfAttention(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(self, x, bias, deterministic: bool, adapter=None):
        cfg = self.config
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        d, h, k = cfg.emb_dim, cfg.num_heads, cfg.head_dim
        project = dict(shape=(d, h, k), axes=("embed", "heads", "kv"), dtype=dtype, pdtype=pdtype, adapter=adapter)
        query = _dense_with_bias(self, "query", x, **project)
        key = _dense_with_bias(self, "key", x, **project)
        value = _dense_with_bias(self, "value", x, **project)
        out = attend(query, key, value, bias, cfg.attention_dropout_rate, deterministic, scale=1.0 / np.sqrt(k))
        return _dense_with_bias(
            self, "out", out, (h, k, d), ("heads", "kv", "embed"), dtype, pdtype, in_dims=2, adapter=adapter
        )


class EncoderLayer(nn.Module):
    config: BertConfig

    @nn.compact
    def __call__(self, x, bias, deterministic: bool, adapter=None):
        cfg = self.config
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        drop = nn.Dropout(cfg.dropout_rate)  # per element, as Hugging Face's BERT
        norm = dict(epsilon=cfg.layer_norm_epsilon, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
        y = SelfAttention(cfg, name="attention")(x, bias, deterministic, sub(adapter, "attention"))
        x = LayerNorm(name="attention_layer_norm", **norm)(x + drop(y, deterministic=deterministic))
        x = nn.with_logical_constraint(x, ACTIVATION_AXES)
        hidden = _dense_with_bias(
            self, "wi", x, (cfg.emb_dim, cfg.mlp_dim), ("embed", "mlp"), dtype, pdtype, adapter=adapter
        )
        hidden = nn.with_logical_constraint(nn.gelu(hidden, approximate=False), ("batch", "length", "mlp"))
        y = _dense_with_bias(
            self, "wo", hidden, (cfg.mlp_dim, cfg.emb_dim), ("mlp", "embed"), dtype, pdtype, adapter=adapter
        )
        x = LayerNorm(name="mlp_layer_norm", **norm)(x + drop(y, deterministic=deterministic))
        return nn.with_logical_constraint(x, ACTIVATION_AXES)


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """[B, L] position of each token within its own run of equal segment ids (0 at a run's start)."""
    index = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)[None, :]
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[:, :1], dtype=bool), segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1
    )
    first = jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
    return index - first


def text_layout(tokens: jax.Array, segment_ids: jax.Array | None):
    """(padding [B, L] bool, each token's position within its text [B, L], the masked keys
    [B, 1, 1 | L, L] bool) of plain rows (padding = id 0) or packed ones (a token sees its own text)."""
    if segment_ids is None:
        padding = tokens == PAD_ID
        return padding, jnp.broadcast_to(jnp.arange(tokens.shape[1])[None, :], tokens.shape), padding[:, None, None, :]
    padding = segment_ids == 0
    other = segment_ids[:, :, None] != segment_ids[:, None, :]
    return padding, segment_positions(segment_ids), (other | padding[:, None, :])[:, None]


class BertEncoder(nn.Module):
    """Token ids [B, L] (0 = [PAD]) -> final hidden states [B, L, emb_dim]; padding keys masked.
    `segment_ids` [B, L]: packed rows (see the module docstring); `adapter`: a LoRA adapter's factors
    (models/lora.Adapter), added to the adapted kernels."""

    config: BertConfig

    @nn.compact
    def __call__(
        self, tokens: jax.Array, deterministic: bool = True, segment_ids: jax.Array | None = None, adapter=None
    ):
        cfg = self.config
        if tokens.ndim != 2:
            raise BadValueError(f"BertEncoder expects token ids [batch, length], got shape {tokens.shape}")
        length = tokens.shape[1]
        if length > cfg.max_length:
            raise BadValueError(
                f"texts of {length} tokens, but the BERT tower has {cfg.max_length} positions "
                "(BertConfig.max_length): lower train.query_length / train.doc_length"
            )
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        words = param(self, "token_embedder", _INIT, (cfg.vocab_size, cfg.emb_dim), ("vocab", "embed"), pdtype)
        places = param(self, "position_embedder", _INIT, (cfg.max_length, cfg.emb_dim), ("positions", "embed"), pdtype)
        types = param(
            self, "token_type_embedder", _INIT, (cfg.type_vocab_size, cfg.emb_dim), ("token_types", "embed"), pdtype
        )
        _, positions, masked = text_layout(tokens, segment_ids)
        x = jnp.take(words, tokens, axis=0).astype(jnp.float32) + jnp.take(places, positions, axis=0).astype(
            jnp.float32
        )
        x = x + types[0].astype(jnp.float32)  # one text per input: token type 0 everywhere
        x = LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, cfg.param_dtype, name="embedding_layer_norm")(x)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        bias = jnp.where(masked, jnp.float32(-1e10), jnp.float32(0.0))
        return apply_layers(self, EncoderLayer, cfg, x.astype(dtype), bias, deterministic, adapter)
