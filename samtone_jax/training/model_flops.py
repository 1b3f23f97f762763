"""Model FLOPs utilisation (MFU): how close a training step runs to the machine's peak, as PaLM,
big_vision and MaxText report it.

Model FLOPs count what the model's math needs for the real tokens, not what the hardware executes
(padding, rematerialisation, GradCache's second forward pass are not counted). Per step, over every
text of the batch (queries, documents, hard negatives), with N the matrix parameters a token passes
through (one tower, its adapter and projection; embedding and relative-position tables are lookups),
L layers, attention width W = heads × head dimension, and each text's real length T_t:

  forward + backward  =  6 · N · Σ_t T_t  +  12 · L · W · Σ_t T_t²

(2 FLOPs a multiply-add, the backward pass twice the forward; the second term is the scores Q·Kᵀ and
the weighted values, each text attending to its own tokens only, packed or not). MFU is that over
the window's seconds, divided by the peak of the devices the step runs on: the table below for
accelerators (dense bfloat16, per chip), and for a CPU a matrix product in the model's compute
dtype measured once a process (all cores: XLA:CPU runs one product on every core).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp

from samtone_jax.models import layout as layout_lib

# Dense bfloat16 peak FLOP/s per chip, by a substring of jax's device_kind (first match wins).
PEAK_FLOPS = (
    ("v6 lite", 918e12),  # TPU v6e (Trillium)
    ("v6e", 918e12),
    ("v5 lite", 197e12),  # TPU v5e
    ("v5e", 197e12),
    ("v5p", 459e12),
    ("TPU v5", 459e12),  # v5p reports itself as "TPU v5"
    ("TPU v4", 275e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM
    ("A100", 312e12),
)


# Parameters of two or more dimensions that are no matrix a token is multiplied by: embedding and
# relative-position tables (looked up) and per-head biases (added).
LOOKUPS = ("embed", "relative", "bias")


def peak_from_table(device_kind: str) -> float | None:
    for name, flops in PEAK_FLOPS:
        if name.lower() in device_kind.lower():
            return flops
    return None


@functools.lru_cache(maxsize=4)
def measured_cpu_peak(dtype: str = "float32", size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the best of `repeats` [size, size] @ [size, size] products on the first CPU device."""
    device = jax.devices("cpu")[0]
    a = jax.device_put(jnp.ones((size, size), dtype), device)
    product = jax.jit(lambda x: x @ x)
    product(a).block_until_ready()  # compiled and warm
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        product(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def device_peak(devices, dtype: str = "float32") -> tuple[float | None, str]:
    """(peak FLOP/s of `devices` together, how it is known): the table's per-chip peak × the chips;
    a CPU's measured product (simulated host devices share the same cores: counted once); None for
    an accelerator not in the table."""
    kind = devices[0].device_kind
    if devices[0].platform == "cpu":
        return measured_cpu_peak(dtype), f"measured {dtype} matmul on the CPU"
    per_chip = peak_from_table(kind)
    if per_chip is None:
        return None, f"no peak known for {kind!r}"
    return per_chip * len(devices), f"{kind} × {len(devices)} (dense bfloat16 peak)"


def matmul_params(model, params) -> int:
    """N of the module docstring: the matrix parameters one side's token passes through (`params`:
    arrays or their shapes)."""
    layout = layout_lib.layout(model.architecture)
    keys = [layout.towers["query"], layout.projections["query"]]
    if layout.adapters:
        keys.append(layout.adapters["query"])
    total = 0
    for key in keys:
        if key not in params:
            continue
        for path, leaf in jax.tree_util.tree_leaves_with_path(params[key]):
            name = jax.tree_util.keystr(path).lower()
            if len(leaf.shape) >= 2 and not any(word in name for word in LOOKUPS):
                total += math.prod(leaf.shape)
    return total


@dataclasses.dataclass(frozen=True)
class ModelFlops:
    """The terms of the module docstring's count for one model."""

    matmul_params: int
    layers: int
    attention_width: int

    @classmethod
    def of(cls, model, params) -> ModelFlops:
        config = model.config
        return cls(matmul_params(model, params), config.num_layers, config.num_heads * config.head_dim)

    def per_step(self, tokens: float, attended: float) -> float:
        """FLOPs of a step whose texts have Σ T_t = tokens and Σ T_t² = attended."""
        return 6.0 * self.matmul_params * tokens + 12.0 * self.layers * self.attention_width * attended


def _lengths(tokens: jax.Array, segment_ids: jax.Array | None, max_segments: int | None) -> jax.Array:
    """Each text's real length, float32: per row of [.., L] ids (0 pads), or per segment of packed rows."""
    if segment_ids is None:
        return jnp.sum(tokens != 0, axis=-1).astype(jnp.float32).reshape(-1)
    segments = jnp.arange(1, max_segments + 1, dtype=segment_ids.dtype)
    return jnp.sum(segment_ids[..., None] == segments, axis=-2).astype(jnp.float32).reshape(-1)


def batch_tokens(batch: dict, max_segments: int | None = None) -> dict[str, jax.Array]:
    """{tokens: Σ T_t, attended_tokens: Σ T_t²} over the batch's texts (packed: `max_segments` a row)."""
    lengths = []
    for prefix in ("query", "doc"):
        if f"{prefix}_tokens" in batch:
            segments = batch.get(f"{prefix}_segment_ids")
            lengths.append(_lengths(batch[f"{prefix}_tokens"], segments, max_segments))
    if "negative_tokens" in batch:  # unpacked only: packed negatives share the document rows
        lengths.append(_lengths(batch["negative_tokens"], None, None))
    every = jnp.concatenate(lengths)
    return {"tokens": jnp.sum(every), "attended_tokens": jnp.sum(every * every)}
