"""The ModernBERT encoder stack in Flax Linen, with Hugging Face `ModernBertModel` semantics (tested
against it on tiny random configs, every option below).

  embeddings  word embeddings only (no position table), then a norm and dropout;
  each layer  pre-norm: x += Wo·attend(rope(q), rope(k), v) over norm(x) (layer 0 reads x itself:
              it has no attention norm), then x += Wo·(act(Wi₀·norm(x)) ⊙ Wi₁·norm(x)) (a gated
              MLP: Hugging Face's Wi is [input; gate], 2 × intermediate wide); one fused Wqkv;
  attention   alternating: layer i is global when i is a multiple of global_attention_every, else
              local (a key within local_attention // 2 tokens of its query, inclusive); rotary
              embeddings (RoPE, rotate-half form) with a theta per kind (global 160,000, local 10,000);
  biases      none by default (attention_bias, mlp_bias, norm_bias switch each kind on);
  final norm  after the last layer.

Packed rows (segment_ids, as BertEncoder): each text's rotary positions restart at 0 and its local
window is measured inside the text (a text is a contiguous run, so the row's own offsets are the
text's), which is ModernBERT's own unpadded form: each packed text gets the hidden states it gets alone.

Vocabulary: ModernBERT pads with [PAD] = 50283; the tokenizer (data/wordpiece_tokens.py) and the
importer swap it with id 0 (the family's hf_pad_id), so 0 pads here as in every tower.

The layers are not all alike (layer 0 has no attention norm; the window and theta alternate), so
they run unrolled (remat works); scan_layers is refused.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from samtone_jax.core.errors import BadValueError
from samtone_jax.models.bert.tower import text_layout
from samtone_jax.models.dense import dense, low_rank, sub
from samtone_jax.models.layer_stack import apply_layers
from samtone_jax.models.layers import ACTIVATION_AXES, attend, param

_INIT = nn.initializers.truncated_normal(0.02)
PAD_ID = 50283  # [PAD] in ModernBERT's vocabulary: swapped with 0 on the way in and out
# Hugging Face's hidden_activation values this tower computes, and how.
ACTIVATIONS = {
    "gelu": lambda x: nn.gelu(x, approximate=False),
    "gelu_new": lambda x: nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: nn.gelu(x, approximate=True),
    "relu": nn.relu,
    "silu": nn.silu,
}
GLOBAL, LOCAL = "full_attention", "sliding_attention"  # Hugging Face's layer_types


@dataclasses.dataclass(frozen=True)
class ModernBertConfig:
    """Hyper-parameters of a ModernBERT encoder (ModernBERT-base's defaults). Names as BertConfig where
    the idea is the same (Hugging Face's name in brackets): emb_dim (hidden_size), num_layers,
    num_heads, head_dim (hidden_size / num_attention_heads), mlp_dim (intermediate_size: the gated
    MLP's width, Wi being twice it), max_length (max_position_embeddings), layer_norm_epsilon
    (norm_eps), dropout_rate (embedding_dropout), mlp_dropout_rate (mlp_dropout),
    attention_dropout_rate (attention_dropout); global_attention_every (global_attn_every_n_layers),
    local_attention, global_rope_theta / local_rope_theta (rope_parameters' full_attention /
    sliding_attention rope_theta), attention_bias, mlp_bias, norm_bias, hidden_activation."""

    vocab_size: int = 50368
    emb_dim: int = 768
    num_heads: int = 12
    num_layers: int = 22
    head_dim: int = 64
    mlp_dim: int = 1152
    max_length: int = 8192
    global_attention_every: int = 3
    local_attention: int = 128
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False
    hidden_activation: str = "gelu"
    layer_norm_epsilon: float = 1e-5
    dropout_rate: float = 0.0
    mlp_dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    scan_layers: bool = False

    def __post_init__(self):
        for name in (
            "vocab_size",
            "emb_dim",
            "num_heads",
            "num_layers",
            "head_dim",
            "mlp_dim",
            "max_length",
            "global_attention_every",
            "local_attention",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise BadValueError(f"ModernBertConfig.{name} must be a positive integer, got {value!r}")
        if self.num_heads * self.head_dim != self.emb_dim:
            raise BadValueError(
                f"ModernBertConfig.num_heads × head_dim = {self.num_heads} × {self.head_dim} must equal emb_dim = "
                f"{self.emb_dim}"
            )
        if self.vocab_size <= PAD_ID:
            raise BadValueError(
                f"ModernBertConfig.vocab_size = {self.vocab_size}: ModernBERT's vocabulary pads with id {PAD_ID}, "
                "so it holds more ids (50368 in ModernBERT-base and -large)"
            )
        if self.head_dim % 2:
            raise BadValueError(f"ModernBertConfig.head_dim = {self.head_dim}: rotary embeddings need an even one")
        if self.hidden_activation not in ACTIVATIONS:
            raise BadValueError(
                f"ModernBertConfig.hidden_activation = {self.hidden_activation!r}; one of {sorted(ACTIVATIONS)}"
            )
        for name in ("global_rope_theta", "local_rope_theta", "layer_norm_epsilon"):
            if not getattr(self, name) > 0:
                raise BadValueError(f"ModernBertConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("dropout_rate", "mlp_dropout_rate", "attention_dropout_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise BadValueError(f"ModernBertConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.scan_layers:
            raise BadValueError(
                "ModernBertConfig.scan_layers = True: ModernBERT's layers are not alike (layer 0 has no attention "
                "norm; global and local attention alternate), so they run unrolled; use remat to save memory"
            )
        for name in ("dtype", "param_dtype"):
            jnp.dtype(getattr(self, name))

    def layer_type(self, layer: int) -> str:
        """Hugging Face's layer_types entry of layer `layer`."""
        return GLOBAL if layer % self.global_attention_every == 0 else LOCAL

    @property
    def window(self) -> int:
        """How far a local layer's key may be from its query (Hugging Face's sliding_window)."""
        return self.local_attention // 2


class Norm(nn.Module):
    """LayerNorm over the last axis in float32, its bias only where the config has one (norm_bias)."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        pdtype = jnp.dtype(cfg.param_dtype)
        x = x.astype(jnp.float32)
        features = (x.shape[-1],)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(variance + cfg.layer_norm_epsilon)
        y = y * param(self, "scale", nn.initializers.ones, features, ("embed",), pdtype).astype(jnp.float32)
        if cfg.norm_bias:
            y = y + param(self, "bias", nn.initializers.zeros, features, ("embed",), pdtype).astype(jnp.float32)
        return y.astype(jnp.dtype(cfg.dtype))


def _dense(module, name, x, shape, axes, use_bias: bool, cfg, in_dims: int = 1, adapter=None):
    """x · kernel (+ bias where the config has one) (+ the LoRA adapter's low-rank term for `name`)."""
    dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
    kernel = param(module, f"{name}_kernel", _INIT, shape, axes, pdtype)
    y = dense(x.astype(dtype), kernel.astype(dtype), in_dims) + low_rank(x, adapter, name, dtype, in_dims)
    if use_bias:
        y = y + param(module, f"{name}_bias", nn.initializers.zeros, shape[in_dims:], axes[in_dims:], pdtype).astype(
            dtype
        )
    return y


def _rotate(x, cos, sin):
    """RoPE in rotate-half form on [B, L, H, K] (float32): x·cos + (−x₂, x₁)·sin."""
    x = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


def rotary(positions, head_dim: int, theta: float):
    """(cos, sin) [B, L, 1, K] of each token's position for rotary embeddings of base `theta`."""
    inverse = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inverse, jnp.float32)
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    return jnp.cos(angles), jnp.sin(angles)


class SelfAttention(nn.Module):
    config: ModernBertConfig

    @nn.compact
    def __call__(self, x, context, deterministic: bool, adapter=None):
        cfg = self.config
        d, h, k = cfg.emb_dim, cfg.num_heads, cfg.head_dim
        bias, cos, sin = context
        qkv = _dense(self, "qkv", x, (d, 3 * h * k), ("embed", "mlp"), cfg.attention_bias, cfg, adapter=adapter)
        query, key, value = (qkv.reshape(*x.shape[:2], 3, h, k)[:, :, i] for i in range(3))
        query, key = (_rotate(t, cos, sin).astype(value.dtype) for t in (query, key))
        out = attend(query, key, value, bias, cfg.attention_dropout_rate, deterministic, scale=1.0 / np.sqrt(k))
        out = _dense(
            self, "out", out, (h, k, d), ("heads", "kv", "embed"), cfg.attention_bias, cfg, in_dims=2, adapter=adapter
        )
        return nn.Dropout(cfg.attention_dropout_rate)(out, deterministic=deterministic)


class EncoderLayer(nn.Module):
    """One pre-norm layer; its index (from its name, layers_<i>) chooses its attention and norm."""

    config: ModernBertConfig

    @nn.compact
    def __call__(self, x, contexts, deterministic: bool, adapter=None):
        cfg = self.config
        index = int(self.name.split("_")[1])
        attention_input = x if index == 0 else Norm(cfg, name="attention_norm")(x)
        y = SelfAttention(cfg, name="attention")(
            attention_input, contexts[cfg.layer_type(index)], deterministic, sub(adapter, "attention")
        )
        x = nn.with_logical_constraint(x + y.astype(x.dtype), ACTIVATION_AXES)
        hidden = _dense(
            self,
            "wi",
            Norm(cfg, name="mlp_norm")(x),
            (cfg.emb_dim, 2 * cfg.mlp_dim),
            ("embed", "mlp"),
            cfg.mlp_bias,
            cfg,
            adapter=adapter,
        )
        hidden = ACTIVATIONS[cfg.hidden_activation](hidden[..., : cfg.mlp_dim]) * hidden[..., cfg.mlp_dim :]
        hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
        hidden = nn.Dropout(cfg.mlp_dropout_rate)(hidden, deterministic=deterministic)
        y = _dense(self, "wo", hidden, (cfg.mlp_dim, cfg.emb_dim), ("mlp", "embed"), cfg.mlp_bias, cfg, adapter=adapter)
        return nn.with_logical_constraint(x + y.astype(x.dtype), ACTIVATION_AXES)


class ModernBertEncoder(nn.Module):
    """Token ids [B, L] (0 = padding) -> final hidden states [B, L, emb_dim]; padding keys masked.
    `segment_ids` [B, L]: packed rows; `adapter`: a LoRA adapter's factors (as BertEncoder)."""

    config: ModernBertConfig

    @nn.compact
    def __call__(
        self, tokens: jax.Array, deterministic: bool = True, segment_ids: jax.Array | None = None, adapter=None
    ):
        cfg = self.config
        if tokens.ndim != 2:
            raise BadValueError(f"ModernBertEncoder expects token ids [batch, length], got shape {tokens.shape}")
        length = tokens.shape[1]
        if length > cfg.max_length:
            raise BadValueError(
                f"texts of {length} tokens, but the ModernBERT tower reads at most {cfg.max_length} "
                "(ModernBertConfig.max_length): lower train.query_length / train.doc_length"
            )
        words = param(
            self, "token_embedder", _INIT, (cfg.vocab_size, cfg.emb_dim), ("vocab", "embed"), jnp.dtype(cfg.param_dtype)
        )
        _, positions, masked = text_layout(tokens, segment_ids)
        x = Norm(cfg, name="embedding_norm")(jnp.take(words, tokens, axis=0))
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)
        offsets = jnp.arange(length)
        far = jnp.abs(offsets[None, :] - offsets[:, None]) > cfg.window  # [L, L], built on the device
        contexts = {
            GLOBAL: (jnp.where(masked, jnp.float32(-1e10), jnp.float32(0.0)),)
            + rotary(positions, cfg.head_dim, cfg.global_rope_theta),
            LOCAL: (jnp.where(masked | far, jnp.float32(-1e10), jnp.float32(0.0)),)
            + rotary(positions, cfg.head_dim, cfg.local_rope_theta),
        }
        x = apply_layers(self, EncoderLayer, cfg, x.astype(jnp.dtype(cfg.dtype)), contexts, deterministic, adapter)
        return Norm(cfg, name="final_norm")(x)
