"""The spread-out term: embeddings pushed apart on the sphere (global orthogonal regularisation,
Zhang et al. 2017, "Learning Spread-out Local Feature Descriptors"; sentence-transformers'
GlobalOrthogonalRegularizationLoss; the spread-out term of Arctic-Embed and EmbeddingGemma).

Two unrelated unit vectors drawn uniformly on the sphere S^{D-1} have a dot product of mean 0 and
second moment 1/D. Over the pairs i ≠ j of one tower's embeddings in the global batch,

  M1 = mean_{i≠j} x_i · x_j        M2 = mean_{i≠j} (x_i · x_j)²
  GOR(x) = M1² + max(0, M2 − 1/D)

and the term is the mean of GOR over the query and the document tower. Embeddings that fill the
sphere lose less when an index keeps only their signs (binary serving) or 8 bits a dimension.

Sharded (`axis_name`, inside shard_map): each device scores its rows against the gathered batch and
the sums are psum'd, so the value and gradient equal one device's with the whole batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from samtone_jax.core.errors import BadValueError


def global_orthogonal(x: jax.Array, axis_name: str | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(GOR, M1, M2) of the module docstring for [b, D] rows (this device's, with `axis_name`)."""
    x = x.astype(jnp.float32)
    b, width = x.shape
    every = x if axis_name is None else jax.lax.all_gather(x, axis_name, tiled=True)
    offset = 0 if axis_name is None else jax.lax.axis_index(axis_name) * b
    s = x @ every.T  # [b, B]
    other = jnp.arange(every.shape[0])[None, :] != (offset + jnp.arange(b))[:, None]
    total, squares = jnp.sum(jnp.where(other, s, 0.0)), jnp.sum(jnp.where(other, s * s, 0.0))
    count = jnp.sum(other).astype(jnp.float32)
    if axis_name is not None:
        total, squares, count = (jax.lax.psum(v, axis_name) for v in (total, squares, count))
    m1, m2 = total / jnp.maximum(count, 1.0), squares / jnp.maximum(count, 1.0)
    return m1 * m1 + jax.nn.relu(m2 - 1.0 / width), m1, m2


def regularized(loss_fn, weight: float):
    """loss_fn (contrastive_loss's signature, or the distillation objective's) + weight · the spread-out
    term of q and d. Metrics:
    loss_fn's, `spread_out/loss` (the term), `spread_out/mean_<tower>` and `spread_out/second_moment_<tower>`
    (M1, M2; an ideal spread is 0 and 1/D), and `loss`, the sum."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < float("inf"):
        raise BadValueError(f"objective.spread_out_weight must be a number >= 0 (0: off); got {weight!r}")

    def loss(q, d, *, axis_name=None, **kwargs):
        value, metrics = loss_fn(q, d, axis_name=axis_name, **kwargs)
        terms, parts = {}, []
        for tower, x in (("query", q), ("document", d)):
            gor, m1, m2 = global_orthogonal(x, axis_name)
            parts.append(gor)
            terms |= {f"spread_out/mean_{tower}": m1, f"spread_out/second_moment_{tower}": m2}
        term = (parts[0] + parts[1]) / 2
        total = value + weight * term
        return total, {**metrics, **terms, "spread_out/loss": term, "loss": total}

    return loss
