"""ADORE (Zhan et al., SIGIR 2021): train the query tower against a frozen, sharded document index,
with dynamic hard negatives retrieved on device at every step.

Per step, inside one jit (shard_map over 'data'; the index is sharded over the same axis):
  1. encode the queries with the live query tower; all-gather them (B × P, small);
  2. every device scores all B queries against its index shard, keeps its top-k, and the
     candidates of all devices merge into the global top-k (ranks 1..k), stop-gradient;
  3. candidates = the top-k plus each query's relevant documents not retrieved (appended at
     rank k + 1, as the paper appends them); their scores are recomputed with gradient: each
     device scores the candidates in its shard, a psum assembles them (the transpose of psum sends
     each device the cotangent of its rows' scores, so the gradient is exact);
  4. RankNet over every (relevant i, irrelevant j) candidate pair, weighted by
     |m(r_i) − m(r_j)| with m(r) = 1/r for r ≤ metric_cut else 0 (ΔMRR@cut, LambdaRank style):
       L = mean_queries Σ_{i rel, j irr} w_ij · log(1 + e^{(s_j − s_i)/τ}).
Relevance comes from the qrels (every gold document of the query), so a retrieved gold document
is never a negative. Only the query tower and query projection get updates; the document side
stays what built the index.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from samtone_jax.evaluation.search import chunked_top_k


def reciprocal_rank_gain(ranks: jax.Array, metric_cut: int) -> jax.Array:
    """m(r) = 1/r for 1 <= r <= metric_cut, else 0 (ranks are 1-based)."""
    ranks = ranks.astype(jnp.float32)
    return jnp.where(ranks <= metric_cut, 1.0 / jnp.maximum(ranks, 1.0), 0.0)


def lambda_weights(ranks: jax.Array, relevant: jax.Array, valid: jax.Array, metric_cut: int) -> jax.Array:
    """[B, C, C] weights w[b, i, j] = |m(r_i) − m(r_j)| for i relevant, j irrelevant (both valid), else 0."""
    gain = reciprocal_rank_gain(ranks, metric_cut)
    pairs = (relevant & valid)[:, :, None] & (~relevant & valid)[:, None, :]
    return jnp.where(pairs, jnp.abs(gain[:, :, None] - gain[:, None, :]), 0.0)


def ranknet_lambda_loss(
    scores: jax.Array, ranks: jax.Array, relevant: jax.Array, valid: jax.Array, metric_cut: int, temperature: float
) -> jax.Array:
    """scores [B, C] (with gradient), ranks [B, C] 1-based, relevant / valid [B, C] -> [B] per-query loss."""
    w = jax.lax.stop_gradient(lambda_weights(ranks, relevant, valid, metric_cut))
    margin = (scores[:, None, :] - scores[:, :, None]) / temperature  # s_j − s_i for pair (i, j)
    return jnp.sum(w * jax.nn.softplus(margin), axis=(1, 2))


def _candidate_scores(q, rows, scale):
    """q [B, D] · rows [B, C, D] -> [B, C] (rows float32, bf16, or int8 times its per-row scale [B, C])."""
    out = jnp.einsum("bd,bcd->bc", q, rows.astype(jnp.float32), preferred_element_type=jnp.float32)
    return out if scale is None else out * scale


def adore_loss_local(
    q,
    index,
    scale,
    positives,
    *,
    k: int,
    metric_cut: int,
    temperature: float,
    n: int,
    chunk_size: int,
    axis_name: str = "data",
):
    """Inside shard_map: q [b, P] local queries, index [N/devices, P] the local shard (scale [N/devices]
    for int8, else None), positives [b, G] global corpus indices (-1 = padding). Returns (loss, metrics)."""
    b = q.shape[0]
    shard_rows = index.shape[0]
    device = jax.lax.axis_index(axis_name)
    offset = device * shard_rows
    q_all = jax.lax.all_gather(q, axis_name, tiled=True)  # [B, P]
    positives_all = jax.lax.all_gather(positives, axis_name, tiled=True)  # [B, G]

    # 2. the global top-k, without gradient.
    frozen_q = jax.lax.stop_gradient(q_all)
    # Chunk by chunk, at the matmul precision of the candidates' scores below (the platform's default:
    # the hot path of a training step; the negatives need no float32-exact order).
    top_scores, top_ids = chunked_top_k(frozen_q, index, k, chunk_size, n, offset, scale=scale, exact=False)
    top_scores = jax.lax.all_gather(top_scores, axis_name, axis=1, tiled=True)
    top_ids = jax.lax.all_gather(top_ids, axis_name, axis=1, tiled=True)
    _, where = jax.lax.top_k(top_scores, k)
    retrieved = jnp.take_along_axis(top_ids, where, axis=1)  # [B, k], rank order

    # 3. candidates: retrieved, then the relevant documents that were not retrieved.
    in_top = jnp.any(positives_all[:, :, None] == retrieved[:, None, :], axis=2)  # [B, G]
    appended_valid = (positives_all >= 0) & ~in_top
    candidates = jnp.concatenate([retrieved, jnp.where(appended_valid, positives_all, -1)], axis=1)
    valid = jnp.concatenate([retrieved >= 0, appended_valid], axis=1)
    relevant = jnp.any(candidates[:, :, None] == positives_all[:, None, :], axis=2) & (candidates >= 0)
    ranks = jnp.concatenate(
        [jnp.broadcast_to(jnp.arange(1, k + 1), retrieved.shape), jnp.full(positives_all.shape, k + 1)], axis=1
    )
    local = candidates - offset
    mine = (local >= 0) & (local < shard_rows) & valid
    rows = index[jnp.clip(local, 0, shard_rows - 1)]  # [B, C, P] of this shard's candidates
    part = _candidate_scores(q_all, rows, None if scale is None else scale[jnp.clip(local, 0, shard_rows - 1)])
    scores = jax.lax.psum(jnp.where(mine, part, 0.0), axis_name)  # [B, C], exact gradient to q_all

    # 4. each device the loss of its own rows.
    rows_here = device * b + jnp.arange(b)
    per_query = ranknet_lambda_loss(
        scores[rows_here], ranks[rows_here], relevant[rows_here], valid[rows_here], metric_cut, temperature
    )
    first_relevant = jnp.min(jnp.where(relevant[rows_here][:, :k], ranks[rows_here][:, :k], k + 1), axis=1)
    metrics = {
        "loss": jnp.mean(per_query),
        "retrieved_mrr": jnp.mean(reciprocal_rank_gain(first_relevant, metric_cut)),
        "retrieved_p1": jnp.mean(relevant[rows_here][:, 0].astype(jnp.float32)),
        "relevant_retrieved": jnp.mean(jnp.any(relevant[rows_here][:, :k], axis=1).astype(jnp.float32)),
        "positive_similarity": jnp.sum(jnp.where(relevant[rows_here], scores[rows_here], 0.0))
        / jnp.maximum(jnp.sum(relevant[rows_here]), 1),
    }
    metrics = jax.lax.pmean(metrics, axis_name)
    return metrics["loss"], metrics
