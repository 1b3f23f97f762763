"""The T5.1.1 encoder stack in Flax Linen, with T5X semantics.

Differences from the original (1.0) T5 that T5.1.1 introduced, all kept here: gated-GELU MLP
(`wi_0`, `wi_1`, `wo`; tanh GELU), no parameter sharing between embedding and classifier
(irrelevant for an encoder), dropout in pre-training off / on in fine-tuning. The 1.0 ReLU MLP
(`wi`, `wo`) is `mlp_activations=('relu',)`.

What matches T5X / Mesh-TF / Hugging Face exactly (tested against `transformers.T5EncoderModel`):
  * one relative-position bias table shared by every layer (bidirectional buckets);
  * pre-norm RMSNorm (no mean subtraction, no bias), computed in float32;
  * attention logits without 1/sqrt(d_kv): T5 folds that factor into the query initialiser;
  * no biases anywhere.

Parameters are created boxed with logical axis names (`nn.with_logical_partitioning`), so
`nn.get_partition_spec` of the initialised variables maps them onto a mesh by rules.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from samtone_jax.core.errors import BadValueError
from samtone_jax.models.dense import dense as _dense
from samtone_jax.models.dense import low_rank, sub
from samtone_jax.models.layer_stack import apply_layers
from samtone_jax.models.layers import ACTIVATION_AXES, PAD_ID, attend, fan_in_init, param

Dtype = Any


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Hyper-parameters of a T5 encoder; names follow T5X's `network.T5Config`.

    Sizes of the public T5.1.1 checkpoints live in `gin_configs/models/t5_1_1_*.gin`.
    """

    vocab_size: int = 32128
    emb_dim: int = 512
    num_heads: int = 6
    num_layers: int = 8
    head_dim: int = 64
    mlp_dim: int = 1024
    mlp_activations: tuple[str, ...] = ("gelu", "linear")
    dropout_rate: float = 0.0
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    dtype: str = "float32"  # activations; 'bfloat16' on TPU
    param_dtype: str = "float32"
    # Rematerialise each encoder layer in the backward pass (jax.checkpoint): only the layer inputs
    # are kept between forward and backward, and under FSDP each layer's weights are gathered
    # again when its backward runs instead of living from forward to backward. Same gradients.
    remat: bool = False
    # Run the layers as one lax.scan over their stacked parameters (the parameter tree keeps its
    # layers_<i> layout: importers, exporters and checkpoints are unaffected). A loop body holds one
    # layer, so under FSDP one layer's gathered weights are live at a time; compile time no longer
    # grows with depth. Same outputs and gradients as the unrolled layers (dropout masks are drawn
    # differently: per layer from fold_in(key, layer)).
    scan_layers: bool = False

    def __post_init__(self):
        # gin passes lists; keep the config hashable (it is a static argument of jit).
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        for name in ("vocab_size", "emb_dim", "num_heads", "num_layers", "head_dim", "mlp_dim"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise BadValueError(f"T5Config.{name} must be a positive integer, got {value!r}")
        unknown = [a for a in self.mlp_activations if a not in _ACTIVATIONS]
        if not self.mlp_activations or unknown:
            raise BadValueError(
                f"T5Config.mlp_activations={self.mlp_activations!r}: each must be one of "
                f"{sorted(_ACTIVATIONS)} (T5.1.1: ('gelu', 'linear'); T5 1.0: ('relu',))"
            )
        if not 0.0 <= self.dropout_rate < 1.0:
            raise BadValueError(f"T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate}")
        for name in ("dtype", "param_dtype"):
            jnp.dtype(getattr(self, name))  # raises TypeError naming the bad dtype


def _gelu_tanh(x):
    return nn.gelu(x, approximate=True)


_ACTIVATIONS = {"gelu": _gelu_tanh, "relu": nn.relu, "linear": lambda x: x}


class RMSNorm(nn.Module):
    """T5 layer norm: x / sqrt(mean(x^2) + eps) * scale, computed in float32."""

    epsilon: float = 1e-6
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = x.astype(jnp.float32)
        scale = param(self, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",), self.param_dtype)
        y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.epsilon)
        return (y * scale.astype(jnp.float32)).astype(self.dtype)


def relative_position_bucket(relative_position, num_buckets: int, max_distance: int):
    """Bidirectional T5 buckets for `memory_position - query_position` (numpy, static shapes; packed
    rows look their buckets up in a table of this function's values).

    Half the buckets are for keys after the query; in each half, exact buckets for distances
    below num_buckets/4 and log-spaced buckets up to `max_distance`, beyond which all share the
    last bucket. Same arithmetic as T5X / Mesh-TF / Hugging Face.
    """
    num_buckets //= 2
    bucket = (relative_position > 0).astype(np.int32) * num_buckets
    n = np.abs(relative_position)
    max_exact = num_buckets // 2
    # Distances below max_exact take the exact branch; clamp them so log() sees no zero.
    far = np.maximum(n, max_exact).astype(np.float32)
    large = max_exact + (np.log(far / max_exact) / np.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(
        np.int32
    )
    large = np.minimum(large, num_buckets - 1)
    return bucket + np.where(n < max_exact, n, large)


class RelativePositionBias(nn.Module):
    """One [heads, buckets] table; returns the additive attention bias [1, heads, q, k]."""

    config: T5Config

    @nn.compact
    def __call__(self, query_length: int, key_length: int):
        cfg = self.config
        table = param(
            self,
            "rel_embedding",
            nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
            (cfg.num_heads, cfg.relative_attention_num_buckets),
            ("heads", "relpos_buckets"),
            jnp.dtype(cfg.param_dtype),
        )
        relative = np.arange(key_length)[None, :] - np.arange(query_length)[:, None]
        buckets = relative_position_bucket(
            relative, cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance
        )
        # A gather with static indices; [heads, q, k].
        bias = table.astype(jnp.float32)[:, buckets]
        return bias[None]


class SelfAttention(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x, bias, deterministic: bool, adapter=None):
        cfg = self.config
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        d, h, k = cfg.emb_dim, cfg.num_heads, cfg.head_dim
        # The 1/sqrt(head_dim) of scaled dot-product attention lives in the query initialiser.
        q_kernel = param(self, "query", fan_in_init(1.0 / k), (d, h, k), ("embed", "heads", "kv"), pdtype)
        k_kernel = param(self, "key", fan_in_init(), (d, h, k), ("embed", "heads", "kv"), pdtype)
        v_kernel = param(self, "value", fan_in_init(), (d, h, k), ("embed", "heads", "kv"), pdtype)
        o_kernel = param(self, "out", fan_in_init(), (h, k, d), ("heads", "kv", "embed"), pdtype)
        x = x.astype(dtype)
        query = _dense(x, q_kernel.astype(dtype)) + low_rank(x, adapter, "query", dtype)
        key = _dense(x, k_kernel.astype(dtype)) + low_rank(x, adapter, "key", dtype)
        value = _dense(x, v_kernel.astype(dtype)) + low_rank(x, adapter, "value", dtype)
        out = attend(query, key, value, bias, cfg.dropout_rate, deterministic)
        return _dense(out, o_kernel.astype(dtype), in_dims=2) + low_rank(out, adapter, "out", dtype, in_dims=2)


class MlpBlock(nn.Module):
    """T5.1.1 gated MLP (`wi_0`, `wi_1`) or the 1.0 single-activation MLP (`wi`)."""

    config: T5Config

    @nn.compact
    def __call__(self, x, deterministic: bool, adapter=None):
        cfg = self.config
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        acts = cfg.mlp_activations
        hidden = None
        for i, act in enumerate(acts):
            name = "wi" if len(acts) == 1 else f"wi_{i}"
            kernel = param(self, name, fan_in_init(), (cfg.emb_dim, cfg.mlp_dim), ("embed", "mlp"), pdtype)
            h = _ACTIVATIONS[act](_dense(x.astype(dtype), kernel.astype(dtype)) + low_rank(x, adapter, name, dtype))
            hidden = h if hidden is None else hidden * h
        hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
        hidden = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(hidden, deterministic=deterministic)
        wo = param(self, "wo", fan_in_init(), (cfg.mlp_dim, cfg.emb_dim), ("mlp", "embed"), pdtype)
        return _dense(hidden, wo.astype(dtype)) + low_rank(hidden, adapter, "wo", dtype)


class EncoderLayer(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x, bias, deterministic: bool, adapter=None):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        drop = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        norm = dict(epsilon=cfg.layer_norm_epsilon, dtype=dtype, param_dtype=jnp.dtype(cfg.param_dtype))
        y = RMSNorm(name="pre_attention_layer_norm", **norm)(x)
        y = SelfAttention(cfg, name="attention")(y, bias, deterministic, sub(adapter, "attention"))
        x = nn.with_logical_constraint(x + drop(y, deterministic=deterministic), ACTIVATION_AXES)
        y = RMSNorm(name="pre_mlp_layer_norm", **norm)(x)
        y = MlpBlock(cfg, name="mlp")(y, deterministic, sub(adapter, "mlp"))
        return nn.with_logical_constraint(x + drop(y, deterministic=deterministic), ACTIVATION_AXES)


class T5Encoder(nn.Module):
    """Token ids [B, L] (0 = padding) -> final hidden states [B, L, emb_dim].

    Padding keys are masked in every attention; hidden states at padding positions are
    computed but meaningless (pooling ignores them).

    Packed rows (T5X's convention): `segment_ids` [B, L] numbers the texts of a row 1, 2, ...
    (0 = padding), each text one contiguous run of its row. A token attends only to its own text.
    Within a run, the distance between two tokens in the row is their distance in the text (the
    text's offset cancels), so the row's relative-position bias is the text's own: each text's
    hidden states are the ones it gets alone in a row, with no per-row [B, heads, L, L] bias
    gathered (and no scatter of its gradient) as per-text positions would need.
    """

    config: T5Config

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        deterministic: bool = True,
        segment_ids: jax.Array | None = None,
        adapter=None,
    ) -> jax.Array:
        """`adapter`: a LoRA adapter's factors (models/lora.Adapter), added to the adapted kernels."""
        cfg = self.config
        if tokens.ndim != 2:
            raise BadValueError(f"T5Encoder expects token ids [batch, length], got shape {tokens.shape}")
        dtype, pdtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        embedding = param(
            self,
            "token_embedder",
            nn.initializers.normal(stddev=1.0),
            (cfg.vocab_size, cfg.emb_dim),
            ("vocab", "embed"),
            pdtype,
        )
        x = jnp.take(embedding, tokens, axis=0).astype(dtype)
        drop = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        x = drop(x, deterministic=deterministic)

        length = tokens.shape[1]
        position_bias = RelativePositionBias(cfg, name="relpos_bias")(length, length)
        if segment_ids is None:
            masked = (tokens == PAD_ID)[:, None, None, :]
        else:  # keys of other texts and padding keys
            other = segment_ids[:, :, None] != segment_ids[:, None, :]
            masked = (other | (segment_ids == 0)[:, None, :])[:, None]
        bias = jnp.where(masked, jnp.float32(-1e10), position_bias)

        x = apply_layers(self, EncoderLayer, cfg, x, bias, deterministic, adapter)
        x = RMSNorm(cfg.layer_norm_epsilon, dtype, pdtype, name="encoder_norm")(x)
        return drop(x, deterministic=deterministic)
