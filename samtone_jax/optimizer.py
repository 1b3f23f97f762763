"""The optimizer every training mode uses: optax.adafactor with T5X's settings and a linear schedule
(gin `adafactor.*`)."""

from __future__ import annotations

import gin
import optax


@gin.configurable
def adafactor(
    learning_rate: float = 1e-3,
    train_steps: int = gin.REQUIRED,
    warmup_steps: int = 0,
    min_dim_size_to_factor: int = 32,
):
    """optax.adafactor with T5X's defaults (factored, decay 0.8, clipping 1.0, parameter scale) and
    a linear decay from `learning_rate` to 0 at `train_steps`, after an optional linear warmup.

    min_dim_size_to_factor 32 (optax's default is 128): our attention kernels are 3-D [embed, heads,
    kv] and optax factors the two largest dimensions only when the second is ≥ this; with 128, a
    T5.1.1 kernel (heads, kv ≤ 64) would keep a full second moment the size of the kernel (6 GB at
    XXL) where T5X, storing it 2-D [embed, heads·kv], keeps factored row/column statistics."""
    decay = optax.linear_schedule(learning_rate, 0.0, max(train_steps - warmup_steps, 1))
    schedule = decay
    if warmup_steps:
        schedule = optax.join_schedules(
            [optax.linear_schedule(0.0, learning_rate, warmup_steps), decay], [warmup_steps]
        )
    tx = optax.adafactor(
        schedule,
        decay_rate=0.8,
        clipping_threshold=1.0,
        multiply_by_parameter_scale=True,
        min_dim_size_to_factor=min_dim_size_to_factor,
    )
    return tx, schedule
