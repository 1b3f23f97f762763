"""The training optimizer (gin `optimizer.kind`): optax.adafactor with T5X's settings (the default,
gin `adafactor.*`) or AdamW as Hugging Face's Trainer and sentence-transformers fine-tune with it
(gin `adamw.*`), each with a linear schedule (optional linear warm-up, then decay to 0)."""

from __future__ import annotations

import gin
import jax
import optax

from samtone_jax.core.errors import BadValueError

KINDS = ("adafactor", "adamw")


@gin.configurable("optimizer", denylist=["adapters"])
def make(train_steps: int, kind: str = "adafactor", adapters: bool = False, learning_rate: float | None = None):
    """(optax transformation, learning-rate schedule) of `kind`: 'adafactor' (gin adafactor.*) or
    'adamw' (gin adamw.*). `adapters`: the parameters hold LoRA adapters (models/lora.py).
    `learning_rate` (`samtone train --learning_rate`), when set, is the peak rate of either kind, over
    its own gin setting."""
    rate = {} if learning_rate is None else {"learning_rate": learning_rate}
    if kind == "adafactor":
        return adafactor(train_steps=train_steps, adapters=adapters, **rate)
    if kind == "adamw":
        return adamw(train_steps=train_steps, **rate)
    raise BadValueError(f"optimizer.kind = {kind!r}: choose one of {', '.join(map(repr, KINDS))}")


def _linear(learning_rate: float, train_steps: int, warmup_steps: int):
    decay = optax.linear_schedule(learning_rate, 0.0, max(train_steps - warmup_steps, 1))
    if not warmup_steps:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, learning_rate, warmup_steps), decay], [warmup_steps])


@gin.configurable
def adamw(
    learning_rate: float = 5e-5,
    train_steps: int = gin.REQUIRED,
    warmup_steps: int = 0,
    weight_decay: float = 0.01,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    clip_norm: float = 1.0,
):
    """AdamW as transformers' Trainer runs it (what sentence-transformers fine-tunes with): gradients
    clipped to global norm `clip_norm`, weight decay on matrices only (not biases, LayerNorm scales or
    other 1-D parameters), a linear decay to 0 at `train_steps` after an optional linear warm-up."""
    schedule = _linear(learning_rate, train_steps, warmup_steps)
    decayed = lambda params: jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)  # noqa: E731
    tx = optax.chain(
        optax.clip_by_global_norm(clip_norm),
        optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decayed),
    )
    return tx, schedule


@gin.configurable(denylist=["adapters"])
def adafactor(
    learning_rate: float = 1e-3,
    train_steps: int = gin.REQUIRED,
    warmup_steps: int = 0,
    min_dim_size_to_factor: int = 32,
    adapters: bool = False,
):
    """optax.adafactor with T5X's defaults (factored, decay 0.8, clipping 1.0, parameter scale) and
    a linear decay from `learning_rate` to 0 at `train_steps`, after an optional linear warmup.

    min_dim_size_to_factor 32 (optax's default is 128): our attention kernels are 3-D [embed, heads,
    kv] and optax factors the two largest dimensions only when the second is ≥ this; with 128, a
    T5.1.1 kernel (heads, kv ≤ 64) would keep a full second moment the size of the kernel (6 GB at
    XXL) where T5X, storing it 2-D [embed, heads·kv], keeps factored row/column statistics.

    `adapters` (LoRA): the adapters' factors take steps of the learning rate itself, not scaled by
    their RMS: B starts at zero, where the parameter scale (floored at 1e-3) would leave it nearly
    still (1e-3 · learning_rate a step). Every other parameter is stepped as without adapters."""
    schedule = _linear(learning_rate, train_steps, warmup_steps)

    def rule(parameter_scale: bool):
        return optax.adafactor(
            schedule,
            decay_rate=0.8,
            clipping_threshold=1.0,
            multiply_by_parameter_scale=parameter_scale,
            min_dim_size_to_factor=min_dim_size_to_factor,
        )

    if not adapters:
        return rule(True), schedule
    from samtone_jax.models.layout import ADAPTER_KEYS

    def labels(params):
        return {
            k: jax.tree_util.tree_map(lambda _, k=k: "factors" if k in ADAPTER_KEYS else "weights", v)
            for k, v in params.items()
        }

    return optax.multi_transform({"weights": rule(True), "factors": rule(False)}, labels), schedule
