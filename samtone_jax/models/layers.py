"""Building blocks every tower family shares: the padding id, the residual stream's logical axes,
parameters boxed with their logical axis names, T5X's fan-in initialiser, and multi-head attention."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

PAD_ID = 0
# Logical names of the residual stream's axes. Under partitioning.activation_sharding (the train
# step) they pin activations to the batch layout, so with FSDP XLA gathers each layer's weights
# instead of gathering the batch; outside it (or without rules) the constraints are no-ops.
ACTIVATION_AXES = ("batch", "length", "activation_embed")


def param(module: nn.Module, name: str, init, shape, axes, dtype):
    """A parameter boxed with its logical axis names (one per dimension)."""
    if len(axes) != len(shape):
        raise ValueError(f"parameter {name}: {len(shape)}-D shape {shape} but logical axes {axes}")
    return module.param(name, nn.with_logical_partitioning(init, axes), shape, dtype)


def fan_in_init(scale: float = 1.0):
    # T5X's default kernel initialiser: variance scaling on fan-in, truncated normal.
    return nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")


def attend(query, key, value, bias, dropout_rate: float, deterministic: bool, scale: float = 1.0):
    """Multi-head attention of [B, L, H, K] queries over keys / values: softmax(scale·q·k + bias) in
    float32 (bias [B | 1, H | 1, Lq, Lk]: masks and position bias), dropout on the weights (called
    from a module's compact method), -> [B, L, H, K] in the values' dtype.

    Heads-major batched matmuls ([B, H, L, K] copies first) rather than einsums over the [B, L, H, K]
    layout: XLA:CPU runs the latter's batched dots 3.6x slower (all-MiniLM-L6-v2's attention at 48
    tokens, forward; the backward is unchanged; benchmarks/encode_bench.py)."""
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))  # [B, H, L, K]
    logits = jnp.matmul(q, jnp.swapaxes(k, -1, -2)).astype(jnp.float32)
    weights = jax.nn.softmax(logits * scale + bias, axis=-1).astype(value.dtype)  # · 1.0 is exact (T5)
    weights = nn.Dropout(dropout_rate)(weights, deterministic=deterministic)
    return jnp.swapaxes(jnp.matmul(weights, v), 1, 2)
