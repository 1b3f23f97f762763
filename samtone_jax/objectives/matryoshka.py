"""Matryoshka embeddings (Kusupati et al. 2022): one model whose first k dimensions are themselves a
good embedding, so a user trades index size for quality at serving time.

  L = Σ_i w_i · L_c(q[:, :k_i] / ‖q[:, :k_i]‖, d[:, :k_i] / ‖d[:, :k_i]‖, n[..., :k_i] / ‖·‖, ...)

for nested dimensions k_1 < k_2 < ... (the full dimension may be one of them) and weights w_i
(1 each by default, as sentence-transformers' MatryoshkaLoss), L_c any contrastive loss of
losses.py with its ids, guide ids and sharding unchanged: each truncation is a local, per-row
operation, so inside `shard_map` every device truncates its own rows and L_c gathers as usual.
Serving truncates the same way (first k, then re-normalise): `samtone eval --dims`, the export's
`truncate_dim`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from samtone_jax.core.errors import BadValueError


def truncate(x: jax.Array, dim: int) -> jax.Array:
    """[..., D] -> [..., dim]: the first `dim` coordinates, L2-normalised again (float32 norm)."""
    head = x[..., :dim]
    norm = jnp.sqrt(jnp.maximum(jnp.sum(jnp.square(head.astype(jnp.float32)), axis=-1, keepdims=True), 1e-24))
    return (head / norm).astype(x.dtype)


def check_dims(dims: Sequence[int], weights: Sequence[float] | None, what: str = "objective.matryoshka_dims"):
    """(dims, weights) as tuples, validated: strictly increasing positive dims, one weight ≥ 0 each."""
    dims = tuple(int(k) for k in dims)
    if not dims or any(k < 1 for k in dims) or any(a >= b for a, b in zip(dims, dims[1:], strict=False)):
        raise BadValueError(f"{what} must be strictly increasing positive dimensions, e.g. (64, 128, 256); got {dims}")
    return dims, term_weights(weights, dims, "objective.matryoshka_weights", f"dimension of {what}")


def term_weights(weights: Sequence[float] | None, terms: tuple, name: str, of: str) -> tuple[float, ...]:
    """One weight >= 0 per term, not all 0 (default: 1 each); `name` is the gin setting, `of` what a term is."""
    weights = tuple(float(w) for w in weights) if weights is not None else (1.0,) * len(terms)
    if len(weights) != len(terms) or any(w < 0 for w in weights) or not any(weights):
        raise BadValueError(f"{name} must give one weight >= 0 per {of} {terms} (not all 0); got {weights}")
    return weights


def nested(loss_fn, dims: Sequence[int], weights: Sequence[float] | None = None):
    """loss_fn (contrastive_loss's signature) summed over the nested truncations of the module
    docstring. Metrics: loss_fn's at the largest dimension, `matryoshka/loss_<k>` for every k,
    and `loss`, the weighted sum."""
    dims, weights = check_dims(dims, weights)

    def loss(q, d, *, negatives=None, **kwargs):
        if dims[-1] > q.shape[-1]:
            raise BadValueError(
                f"objective.matryoshka_dims {dims} go beyond the embedding dimension {q.shape[-1]} (PROJECTION_DIM, or "
                "the model's width without a projection)"
            )
        total, terms, metrics = 0.0, {}, {}
        for k, w in zip(dims, weights, strict=True):
            n = None if negatives is None else truncate(negatives, k)
            value, metrics = loss_fn(truncate(q, k), truncate(d, k), negatives=n, **kwargs)
            total = total + w * value
            terms[f"matryoshka/loss_{k}"] = value
        return total, {**metrics, **terms, "loss": total}

    return loss
