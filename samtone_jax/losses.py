"""The contrastive loss family for dual encoders: in-batch softmax, SamToNe, PAIR, GTE.

Notation: B pairs (q_i, p_i) in the *global* batch, optional hard negatives n_{j,k} (K per pair,
their columns shared by every query, STAR-style), s(a, b) = a·b of L2-normalised embeddings,
τ = temperature, S = s / τ.

  query->doc      ℓ_qd(i) = −S(q_i,p_i) + log[ Σ_j e^{S(q_i,p_j)} + Σ_{j,k} e^{S(q_i,n_jk)}
                                              + w·Σ_{j≠i} e^{S(q_i,q_j)}   (same_tower query|both) ]
  doc->query      ℓ_dq(i) = −S(p_i,q_i) + log[ Σ_j e^{S(p_i,q_j)}
                                              + w·Σ_{j≠i} e^{S(p_i,p_j)}   (same_tower doc|both) ]
  mode='samtone'  L = ½(mean ℓ_qd + mean ℓ_dq) if bidirectional else mean ℓ_qd
                  (same_tower='none': the standard [bidirectional] in-batch softmax; unidirectional
                  'none' is DPR's loss; 'query' is SamToNe, Moiseev et al. 2023.)
  mode='pair'     L = (1−α)·L_samtone + α·mean ℓ_P,  ℓ_P(i) = −S(q_i,p_i) + log[ e^{S(q_i,p_i)}
                  + Σ_{j≠i} e^{S(p_i,p_j)} ]  (Ren et al. 2021). With bidirectional=False and
                  same_tower='none' this is exactly PAIR; other settings add PAIR's passage-centric
                  term to the corresponding samtone loss.
  mode='gte'      L = mean −S(q_i,p_i) + log Z_i,  Z_i = Σ_j e^{S(q_i,p_j)} + Σ_j e^{S(q_j,p_i)}
                  + w·Σ_{j≠i} e^{S(q_i,q_j)} + w·Σ_{j≠i} e^{S(p_i,p_j)} [+ Σ e^{S(q_i,n)}]
                  (Li et al. 2023, "improved contrastive loss"; `bidirectional` and `same_tower`
                  are not used: both directions and both towers are already in Z).
  mode='pairwise' STAR's pairwise form (Zhan et al. 2021): ℓ(q, p, n) = log(1 + e^{S(q,n) − S(q,p)})
                  averaged over the valid (q_i, p_j≠i) in-batch ("random") pairs plus averaged over
                  the valid (q_i, n) hard pairs: L = mean_random ℓ + mean_hard ℓ (L_r + L_s).
                  Query-centric: `bidirectional` and `same_tower` are not used.

t5x_retrieval sums the two directions; we average them (so the loss scale does not depend on
`bidirectional`).

Masking (ids): pairs i and j are the *same example* when they share a query id or a document id.
Every entry (i, j ≠ i) between same examples is removed from every negative term, cross-tower
and same-tower alike; a hard negative whose id equals the row's document id is removed too.
Without ids, an example's id is its position in the global batch: only the diagonal is special.
Ids are compared for equality only; with JAX's default 32-bit mode they are int32.

Every partition function is a masked logsumexp in float32 (max-subtracted, masked logits set to
−inf *before* exp), so τ = 0.01 or 0.001 cannot overflow whatever the input dtype.

Sharding: with `axis_name`, call inside `shard_map` over the data axis with local shards. Columns
(q, d, negatives, ids) are all-gathered (differentiably), each device scores only its own rows
against all columns — no device holds the global B×B matrix — and the returned loss and metrics
are global means, equal to a single device holding the whole batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from samtone_jax.errors import BadValueError

MODES = ("samtone", "pair", "gte", "pairwise")
SAME_TOWER = ("none", "query", "doc", "both")


def _is_concrete(x) -> bool:
    return isinstance(x, (int, float, np.ndarray, np.generic))


def _check_inputs(q, d, temperature, mode, same_tower, bidirectional, negatives, ids, same_tower_weight, pair_alpha):
    if mode not in MODES:
        raise BadValueError(f"contrastive_loss: mode={mode!r} must be one of {MODES}")
    if same_tower not in SAME_TOWER:
        raise BadValueError(f"contrastive_loss: same_tower={same_tower!r} must be one of {SAME_TOWER}")
    if mode != "gte" and not bidirectional and same_tower in ("doc", "both"):
        raise BadValueError(
            f"contrastive_loss: same_tower={same_tower!r} adds doc-doc negatives to the doc->query "
            "direction, which bidirectional=False does not compute; use bidirectional=True or same_tower='query'"
        )
    if q.ndim != 2 or d.shape != q.shape:
        raise BadValueError(f"contrastive_loss: q and d must both be [B, D]; got q {q.shape}, d {d.shape}")
    if negatives is not None and (
        negatives.ndim != 3 or negatives.shape[0] != q.shape[0] or negatives.shape[2] != q.shape[1]
    ):
        raise BadValueError(
            f"contrastive_loss: negatives must be [B, K, D] = [{q.shape[0]}, K, {q.shape[1]}]; got {negatives.shape}"
        )
    for name, value, shape in ids:
        if value is not None and tuple(value.shape) != shape:
            raise BadValueError(f"contrastive_loss: {name} must have shape {shape}; got {tuple(value.shape)}")
        if value is not None and not jnp.issubdtype(value.dtype, jnp.integer):
            raise BadValueError(f"contrastive_loss: {name} must be integer ids; got dtype {value.dtype}")
    # Concrete values are checked; a traced temperature (a learnable parameter) cannot be.
    if _is_concrete(temperature) and not np.all(np.asarray(temperature) > 0):
        raise BadValueError(f"contrastive_loss: temperature must be > 0; got {temperature}")
    if _is_concrete(same_tower_weight) and np.any(np.asarray(same_tower_weight) < 0):
        raise BadValueError(f"contrastive_loss: same_tower_weight must be >= 0; got {same_tower_weight}")
    if not 0.0 <= pair_alpha <= 1.0:
        raise BadValueError(f"contrastive_loss: pair_alpha must be in [0, 1]; got {pair_alpha}")


def _scores(rows: jax.Array, columns: jax.Array, temperature) -> jax.Array:
    """[b, D] x [n, D] -> [b, n] float32 logits s/τ (float32 accumulation for any input dtype)."""
    return jnp.einsum("bd,nd->bn", rows, columns, preferred_element_type=jnp.float32) / temperature


@jax.custom_vjp
def _gram(x: jax.Array) -> jax.Array:
    """x @ x.T in float32; its VJP is one matmul, (G + Gᵀ) x, instead of autodiff's two."""
    return jnp.einsum("bd,nd->bn", x, x, preferred_element_type=jnp.float32)


def _gram_fwd(x):
    return _gram(x), x


def _gram_bwd(x, g):
    return (jnp.einsum("bn,nd->bd", g + g.T, x.astype(jnp.float32)).astype(x.dtype),)


_gram.defvjp(_gram_fwd, _gram_bwd)


def masked_logsumexp(blocks) -> jax.Array:
    """log Σ_blocks Σ_cols keep·e^{logits} per row, for a list of (logits [b, n], keep [b, n] | None).

    One max over all blocks, no concatenation (no extra [b, Σn] copy); masked entries are −inf
    before the exp, so they contribute exactly 0 to the value and to the gradient.
    """
    masked = [x if keep is None else jnp.where(keep, x, -jnp.inf) for x, keep in blocks]
    peak = jax.lax.stop_gradient(jnp.max(jnp.stack([jnp.max(x, axis=-1) for x in masked]), axis=0))
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    total = sum(jnp.sum(jnp.exp(x - peak[:, None]), axis=-1) for x in masked)
    return peak + jnp.log(total)


def contrastive_loss(
    q: jax.Array,
    d: jax.Array,
    *,
    temperature: float,  # or a traced scalar (a learnable temperature)
    bidirectional: bool = True,
    same_tower: str = "query",
    mode: str = "samtone",
    negatives: jax.Array | None = None,
    query_ids: jax.Array | None = None,
    doc_ids: jax.Array | None = None,
    negative_ids: jax.Array | None = None,
    same_tower_weight: float = 1.0,
    pair_alpha: float = 0.1,
    axis_name: str | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The contrastive loss of the module docstring, and its metrics.

    Args:
      q, d: [B, D] L2-normalised query and positive-document embeddings (local shard with
        `axis_name`); any float dtype, scored in float32.
      temperature: τ > 0, a float or a scalar array (e.g. exp of a learnable log-temperature).
      negatives: [B, K, D] hard-negative document embeddings, shared as columns by every query.
      query_ids, doc_ids: [B] integer ids; negative_ids: [B, K] (needs doc_ids).
      same_tower_weight: w on the same-tower sums (1.0 in the paper; 0 disables them).
      axis_name: the mesh axis to gather columns over, inside `shard_map`.

    Returns:
      (loss: scalar float32, metrics: dict of scalar float32 — global means when sharded).
    """
    b, dim = q.shape if q.ndim == 2 else (q.shape[0], -1)
    k = 0 if negatives is None else negatives.shape[1]
    _check_inputs(
        q,
        d,
        temperature,
        mode,
        same_tower,
        bidirectional,
        negatives,
        [("query_ids", query_ids, (b,)), ("doc_ids", doc_ids, (b,)), ("negative_ids", negative_ids, (b, k))],
        same_tower_weight,
        pair_alpha,
    )
    if negative_ids is not None and (doc_ids is None or negatives is None):
        raise BadValueError("contrastive_loss: negative_ids needs negatives and doc_ids to compare against")

    def gather(x):
        return x if axis_name is None else jax.lax.all_gather(x, axis_name, tiled=True)

    offset = 0 if axis_name is None else jax.lax.axis_index(axis_name) * b
    rows = offset + jnp.arange(b)  # global index of each local row
    q_all, d_all = gather(q), gather(d)
    global_b = q_all.shape[0]
    positions = jnp.arange(global_b)
    qid_rows = rows if query_ids is None else query_ids
    did_rows = rows if doc_ids is None else doc_ids
    qid_cols = positions if query_ids is None else gather(query_ids)
    did_cols = positions if doc_ids is None else gather(doc_ids)

    is_diagonal = rows[:, None] == positions[None, :]
    if query_ids is None and doc_ids is None:  # only the diagonal is special: no [b, B] id compares
        cross_keep, same_keep = None, ~is_diagonal
    else:
        same_example = (qid_rows[:, None] == qid_cols[None, :]) | (did_rows[:, None] == did_cols[None, :])
        cross_keep = ~same_example | is_diagonal  # the positive stays in cross-tower rows
        same_keep = ~(same_example | is_diagonal)
    log_w = jnp.log(jnp.asarray(same_tower_weight, jnp.float32))

    s_qd = _scores(q, d_all, temperature)
    # Each local row's positive is its own local document: an elementwise product, no gather
    # from the [b, B] block (whose gradient would be a scatter into it).
    positive = jnp.einsum("bd,bd->b", q, d, preferred_element_type=jnp.float32) / temperature
    qd_blocks = [(s_qd, cross_keep)]
    neg_keep = None
    if negatives is not None:
        n_all = gather(negatives.reshape(b * k, dim))
        s_qn = _scores(q, n_all, temperature)
        if negative_ids is not None:
            neg_keep = gather(negative_ids.reshape(b * k))[None, :] != did_rows[:, None]
        qd_blocks.append((s_qn, neg_keep))

    metrics = {}
    ranking = mode != "pairwise"  # the softmax family needs the same-tower / reverse blocks
    need_qq = ranking and (mode == "gte" or same_tower in ("query", "both"))
    need_dd = ranking and (mode in ("gte", "pair") or same_tower in ("doc", "both"))
    need_dq = ranking and (mode == "gte" or bidirectional)
    if axis_name is None:
        # One device holds every row: S_dq is S_qdᵀ and the same-tower blocks are symmetric Gram
        # matrices, so 2 matmuls (plus 3 in the backward pass) do the work of 3 (+6).
        s_qq = _gram(q) / temperature + log_w if need_qq else None
        s_dd = _gram(d) / temperature if need_dd else None
        s_dq = s_qd.T if need_dq else None
    else:
        s_qq = _scores(q, q_all, temperature) + log_w if need_qq else None
        s_dd = _scores(d, d_all, temperature) if need_dd else None
        s_dq = _scores(d, q_all, temperature) if need_dq else None

    if mode == "pairwise":
        random_keep = ~is_diagonal if cross_keep is None else cross_keep & ~is_diagonal
        parts = [(s_qd, random_keep, "random")]
        if negatives is not None:
            parts.append((s_qn, neg_keep, "hard"))
        loss = jnp.zeros((), jnp.float32)
        for logits, keep, name in parts:
            keep = jnp.ones(logits.shape, bool) if keep is None else keep
            pair_loss = jnp.where(keep, jax.nn.softplus(logits - positive[:, None]), 0.0)
            total, count = jnp.sum(pair_loss), jnp.sum(keep).astype(jnp.float32)
            if axis_name is not None:  # a global mean over pairs: sums and counts over all devices
                total, count = jax.lax.psum(total, axis_name), jax.lax.psum(count, axis_name)
            mean = total / jnp.maximum(count, 1.0)
            loss = loss + mean
            metrics[f"pairwise/{name}"] = mean
    elif mode == "gte":
        blocks = [*qd_blocks, (s_dq, cross_keep), (s_qq, same_keep), (s_dd + log_w, same_keep)]
        lse = masked_logsumexp(blocks)
        loss = jnp.mean(lse - positive)
        metrics["logsumexp/joint"] = jnp.mean(lse)
    else:
        if same_tower in ("query", "both"):
            qd_blocks.append((s_qq, same_keep))
        lse_qd = masked_logsumexp(qd_blocks)
        loss = jnp.mean(lse_qd - positive)
        metrics["logsumexp/query_to_doc"] = jnp.mean(lse_qd)
        if bidirectional:
            dq_blocks = [(s_dq, cross_keep)]
            if same_tower in ("doc", "both"):
                dq_blocks.append((s_dd + log_w, same_keep))
            lse_dq = masked_logsumexp(dq_blocks)
            loss = 0.5 * (loss + jnp.mean(lse_dq - positive))
            metrics["logsumexp/doc_to_query"] = jnp.mean(lse_dq)
        if mode == "pair":
            lse_p = masked_logsumexp([(positive[:, None], None), (s_dd, same_keep)])
            loss = (1.0 - pair_alpha) * loss + pair_alpha * jnp.mean(lse_p - positive)
            metrics["logsumexp/passage_centric"] = jnp.mean(lse_p)

    # Diagnostics over the query->doc candidates (in-batch documents and hard negatives).
    off_diagonal = same_keep if cross_keep is None else cross_keep & ~is_diagonal
    hardest = jnp.max(jnp.where(off_diagonal, s_qd, -jnp.inf), axis=1)
    masked_count = jnp.zeros((), jnp.int32) if cross_keep is None else jnp.sum(~cross_keep)
    candidates = b * (global_b - 1)
    if negatives is not None:
        hardest = jnp.maximum(
            hardest, jnp.max(s_qn if neg_keep is None else jnp.where(neg_keep, s_qn, -jnp.inf), axis=1)
        )
        masked_count += 0 if neg_keep is None else jnp.sum(~neg_keep)
        candidates += b * global_b * k
    temperature = jnp.asarray(temperature, jnp.float32)
    metrics.update(
        loss=loss,
        accuracy=jnp.mean((positive > hardest).astype(jnp.float32)),
        positive_similarity=jnp.mean(positive) * temperature,
        hardest_negative_similarity=jnp.mean(jnp.where(jnp.isfinite(hardest), hardest, 0.0)) * temperature,
        masked_fraction=masked_count.astype(jnp.float32) / max(candidates, 1),
        temperature=temperature,
    )
    metrics = {name: value.astype(jnp.float32) for name, value in metrics.items()}
    if axis_name is not None:
        metrics = jax.lax.pmean(metrics, axis_name)
    return metrics["loss"], metrics
