"""A tower's dense maps: x · kernel as one 2-D matmul, and the low-rank term a LoRA adapter adds to it
(models/lora.py). T5 and BERT towers share them."""

from __future__ import annotations

import jax
import numpy as np


def _on_rows(x: jax.Array, in_dims: int, out_shape: tuple, product) -> jax.Array:
    """x [..., *in] flattened to rows [tokens, in], `product`(rows) -> [tokens, prod(out)], and the
    result shaped back to [..., *out]."""
    lead = x.shape[: x.ndim - in_dims]
    rows = x.reshape(-1, int(np.prod(x.shape[x.ndim - in_dims :])))
    return product(rows).reshape(*lead, *out_shape)


def dense(x: jax.Array, kernel: jax.Array, in_dims: int = 1) -> jax.Array:
    """x [..., *in] · kernel [*in, *out] -> [..., *out] as one 2-D matmul [tokens, in] · [in, out].

    Same result as the einsum; XLA:CPU compiles the 2-D form's backward without the transposing
    fusions that the batched 3-D einsum gets (1.7x faster for the gated MLP, forward + backward).
    """
    return _on_rows(x, in_dims, kernel.shape[in_dims:], lambda rows: rows @ kernel.reshape(rows.shape[1], -1))


def low_rank(x, adapter, name: str, dtype, in_dims: int = 1):
    """s · B A x for the kernel `name` of this module's adapter ({name: {a, b}}, b already scaled by
    alpha / rank; models/lora.Adapter), or 0.0 when the kernel is not adapted."""
    if adapter is None or name not in adapter:
        return 0.0
    a, b = adapter[name]["a"].astype(dtype), adapter[name]["b"].astype(dtype)

    def product(rows):
        return _low_rank_2d(rows, a.reshape(rows.shape[1], -1), b.reshape(b.shape[0], -1))

    return _on_rows(x.astype(dtype), in_dims, b.shape[1:], product)


@jax.custom_vjp
def _low_rank_2d(x, a, b):
    """(x [T, in] · a [in, r]) · b [r, out], with a backward whose every dot reads the incoming
    cotangent g [T, out] as it is laid out.

    Autodiff's b gradient, h^T g, is a dot that XLA:CPU feeds a transposed copy of g; under the vmap
    that draws each example's dropout (batch_embeddings.embed), XLA fused the whole producer of g
    (the LayerNorm backwards of the layers above, ~500 instructions a copy) into those copies:
    up to 0.45 s each, and all-MiniLM-L6-v2's packed LoRA-32 step took 1.90x full fine-tuning's
    time (docs/BENCHMARKS.md, benchmarks/lora_step_bench.py). Here b's gradient is (g^T h)^T: g is
    the dot's left operand, contracted over its rows as stored, and only the small [T, r] operands
    are transposed.
    Reverse mode only: jax.jvp / jacfwd of it raise (nothing here uses forward mode)."""
    return (x @ a) @ b


def _low_rank_fwd(x, a, b):
    h = x @ a
    return h @ b, (x, a, b, h)


def _low_rank_bwd(saved, g):
    x, a, b, h = saved
    rows = (((0,), (0,)), ((), ()))  # contract the T rows of both operands
    u = g @ b.T  # [T, r]
    return u @ a.T, jax.lax.dot_general(x, u, rows), jax.lax.dot_general(g, h, rows).T


_low_rank_2d.defvjp(_low_rank_fwd, _low_rank_bwd)


def sub(adapter, key: str):
    """The part of an adapter tree under `key` (None when there is none)."""
    return None if adapter is None else adapter.get(key)
