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
and same-tower alike; a hard negative whose id equals the row's document id is removed too, and one
whose id equals its own pair's document id is removed from every row (the padding of a query with
fewer hard negatives than K: it stands for no negative).
Without ids, an example's id is its position in the global batch: only the diagonal is special.
Ids are compared for equality only; with JAX's default 32-bit mode they are int32.

Teacher-guided negatives (`guide_ids` [B, G], GISTEmbed's idea from offline teacher scores): row
i's guide ids are the documents a teacher scores too close to (or above) i's positive to be a
negative (data/false_negatives.py picks them). Pairs i and j are then also the same example when
document j is among i's guide ids or document i among j's, and a hard negative among the row's
guide ids is removed: every term, cross- and same-tower, as for duplicate ids. Unused slots repeat
the row's own document id (a no-op: that pair is the same example already).

Every partition function is a masked logsumexp in float32 (max-subtracted, masked logits set to
−inf *before* exp), so τ = 0.01 or 0.001 cannot overflow whatever the input dtype.

Sharding: with `axis_name`, call inside `shard_map` over the data axis with local shards. Columns
(q, d, negatives, ids) are all-gathered (differentiably), each device scores only its own rows
against all columns — no device holds the global B×B matrix — and the returned loss and metrics
are global means, equal to a single device holding the whole batch.

Layout: `contrastive_loss` validates, gathers and scores the shared blocks once (`_logits`), calls
one function per mode (`_samtone_loss`, `_pair_loss`, `_gte_loss`, `_pairwise_loss`), and adds
the diagnostics (`_with_diagnostics`). Every softmax term is one `masked_logsumexp` over blocks.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from samtone_jax.core.errors import BadValueError

MODES = ("samtone", "pair", "gte", "pairwise")
SAME_TOWER = ("none", "query", "doc", "both")


def _is_concrete(x) -> bool:
    return isinstance(x, (int, float, np.ndarray, np.generic))


def _check_options(mode, same_tower, bidirectional, temperature, same_tower_weight, pair_alpha):
    if mode not in MODES:
        raise BadValueError(f"contrastive_loss: mode={mode!r} must be one of {MODES}")
    if same_tower not in SAME_TOWER:
        raise BadValueError(f"contrastive_loss: same_tower={same_tower!r} must be one of {SAME_TOWER}")
    if mode != "gte" and not bidirectional and same_tower in ("doc", "both"):
        raise BadValueError(
            f"contrastive_loss: same_tower={same_tower!r} adds doc-doc negatives to the doc->query "
            "direction, which bidirectional=False does not compute; use bidirectional=True or same_tower='query'"
        )
    # Concrete values are checked; a traced temperature (a learnable parameter) cannot be.
    if _is_concrete(temperature) and not np.all(np.asarray(temperature) > 0):
        raise BadValueError(f"contrastive_loss: temperature must be > 0; got {temperature}")
    if _is_concrete(same_tower_weight) and np.any(np.asarray(same_tower_weight) < 0):
        raise BadValueError(f"contrastive_loss: same_tower_weight must be >= 0; got {same_tower_weight}")
    if not 0.0 <= pair_alpha <= 1.0:
        raise BadValueError(f"contrastive_loss: pair_alpha must be in [0, 1]; got {pair_alpha}")


def _check_arrays(q, d, negatives, query_ids, doc_ids, negative_ids, guide_ids=None):
    if q.ndim != 2 or d.shape != q.shape:
        raise BadValueError(f"contrastive_loss: q and d must both be [B, D]; got q {q.shape}, d {d.shape}")
    b, dim = q.shape
    if negatives is not None and (negatives.ndim != 3 or negatives.shape[0] != b or negatives.shape[2] != dim):
        raise BadValueError(f"contrastive_loss: negatives must be [B, K, D] = [{b}, K, {dim}]; got {negatives.shape}")
    k = 0 if negatives is None else negatives.shape[1]
    g = 0 if guide_ids is None else guide_ids.shape[-1]
    ids = [
        ("query_ids", query_ids, (b,)),
        ("doc_ids", doc_ids, (b,)),
        ("negative_ids", negative_ids, (b, k)),
        ("guide_ids", guide_ids, (b, g)),
    ]
    for name, value, shape in ids:
        if value is not None and tuple(value.shape) != shape:
            raise BadValueError(f"contrastive_loss: {name} must have shape {shape}; got {tuple(value.shape)}")
        if value is not None and not jnp.issubdtype(value.dtype, jnp.integer):
            raise BadValueError(f"contrastive_loss: {name} must be integer ids; got dtype {value.dtype}")
    if negative_ids is not None and (doc_ids is None or negatives is None):
        raise BadValueError("contrastive_loss: negative_ids needs negatives and doc_ids to compare against")
    if guide_ids is not None and (doc_ids is None or (negatives is not None and negative_ids is None)):
        raise BadValueError(
            "contrastive_loss: guide_ids needs doc_ids (and, with negatives, negative_ids) to compare against"
        )


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


def _masked(logits: jax.Array, keep: jax.Array | None) -> jax.Array:
    """logits where keep, −inf elsewhere (keep=None: nothing removed)."""
    return logits if keep is None else jnp.where(keep, logits, -jnp.inf)


def masked_logsumexp(blocks) -> jax.Array:
    """log Σ_blocks Σ_cols keep·e^{logits} per row, for a list of (logits [b, n], keep [b, n] | None).

    One max over all blocks, no concatenation (no extra [b, Σn] copy); masked entries are −inf
    before the exp, so they contribute exactly 0 to the value and to the gradient.
    """
    masked = [_masked(x, keep) for x, keep in blocks]
    peak = jax.lax.stop_gradient(jnp.max(jnp.stack([jnp.max(x, axis=-1) for x in masked]), axis=0))
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    total = sum(jnp.sum(jnp.exp(x - peak[:, None]), axis=-1) for x in masked)
    return peak + jnp.log(total)


# ----------------------------------------------------------------------------------------------
# The shared blocks: local rows against gathered columns, scored once for every mode.
# ----------------------------------------------------------------------------------------------
class _Logits(NamedTuple):
    """S = s/τ blocks [b, ·] of this device's b rows against the B gathered columns, and their keeps.

    A keep of None removes nothing. s_qq already carries log w; s_dd does not (PAIR's
    passage-centric term is unweighted), so the softmax modes add log w to it themselves.
    """

    positive: jax.Array  # [b] S(q_i, p_i)
    s_qd: jax.Array  # [b, B] S(q_i, p_j)
    s_qn: jax.Array | None  # [b, B·K] S(q_i, n_jk), the hard negatives
    s_qq: jax.Array | None  # [b, B] S(q_i, q_j) + log w
    s_dd: jax.Array | None  # [b, B] S(p_i, p_j)
    s_dq: jax.Array | None  # [b, B] S(p_i, q_j)
    cross_keep: jax.Array | None  # cross-tower: same examples removed, the positive kept
    same_keep: jax.Array  # same-tower: same examples and the diagonal removed
    neg_keep: jax.Array | None  # hard negatives: those with the row's document id removed
    is_diagonal: jax.Array  # row i's own column (its global index)
    log_w: jax.Array
    guided_count: jax.Array | None  # candidates removed by the guide ids alone (not by id equality)


def _gather(x: jax.Array, axis_name: str | None) -> jax.Array:
    return x if axis_name is None else jax.lax.all_gather(x, axis_name, tiled=True)


def _example_masks(rows, columns, query_ids, doc_ids, guide_ids, axis_name):
    """(is_diagonal, cross_keep, same_keep, guided) [b, B] for rows (global indices) against the columns.

    Pairs are the same example when they share a query id or a document id, or when either's
    guide ids hold the other's document (`guided`: those the ids alone keep); without ids only the
    diagonal is special, and cross_keep is None (no [b, B] id compares).
    """
    qid_rows = rows if query_ids is None else query_ids
    did_rows = rows if doc_ids is None else doc_ids
    qid_cols = columns if query_ids is None else _gather(query_ids, axis_name)
    did_cols = columns if doc_ids is None else _gather(doc_ids, axis_name)
    is_diagonal = rows[:, None] == columns[None, :]
    if query_ids is None and doc_ids is None:
        return is_diagonal, None, ~is_diagonal, None
    same_example = (qid_rows[:, None] == qid_cols[None, :]) | (did_rows[:, None] == did_cols[None, :])
    guided = None
    if guide_ids is not None:
        guide_cols = _gather(guide_ids, axis_name)
        flagged = jnp.any(guide_ids[:, None, :] == did_cols[None, :, None], axis=-1)  # j's doc in i's guide
        flagged |= jnp.any(guide_cols[None, :, :] == did_rows[:, None, None], axis=-1)  # i's doc in j's guide
        guided = flagged & ~same_example & ~is_diagonal
        same_example |= flagged
    return is_diagonal, ~same_example | is_diagonal, ~(same_example | is_diagonal), guided


def _hard_negatives(q, negatives, doc_ids, negative_ids, guide_ids, temperature, axis_name):
    """(S(q_i, n) [b, B·K], keep | None, guided | None): every gathered hard negative is a column of
    every row; removed where its id is the row's document id or among the row's guide ids, and from
    every row when it is its own pair's document (a query with fewer than K negatives padded with its
    positive: inputs.negatives_fallback; that text is an in-batch column already)."""
    if negatives is None:
        return None, None, None
    b, k, dim = negatives.shape
    s_qn = _scores(q, _gather(negatives.reshape(b * k, dim), axis_name), temperature)
    if negative_ids is None:
        return s_qn, None, None
    nid_cols = _gather(negative_ids.reshape(b * k), axis_name)
    owners = _gather(jnp.repeat(doc_ids, k), axis_name)  # each column's own pair's document id
    keep = (nid_cols[None, :] != doc_ids[:, None]) & (nid_cols != owners)[None, :]
    if guide_ids is None:
        return s_qn, keep, None
    guided = jnp.any(guide_ids[:, None, :] == nid_cols[None, :, None], axis=-1) & keep
    return s_qn, keep & ~guided, guided


def _needed_blocks(mode, same_tower, bidirectional) -> tuple[bool, bool, bool]:
    """Which of the q·q, d·d and d·q blocks the mode reads."""
    if mode == "pairwise":  # query-centric: q·d and q·n only
        return False, False, False
    if mode == "gte":  # both towers, both directions, in one partition
        return True, True, True
    return same_tower in ("query", "both"), mode == "pair" or same_tower in ("doc", "both"), bidirectional


def _tower_blocks(q, d, q_all, d_all, s_qd, temperature, log_w, needs, axis_name):
    """(s_qq + log w, s_dd, s_dq), each None where `needs` says the mode does not read it."""
    need_qq, need_dd, need_dq = needs
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
    return s_qq, s_dd, s_dq


def _logits(q, d, negatives, ids, temperature, same_tower_weight, needs, axis_name):
    """Gather the columns (q, d, negatives, ids) over `axis_name`; score the local rows against them.
    ids: (query_ids, doc_ids, negative_ids, guide_ids), each None or an array."""
    query_ids, doc_ids, negative_ids, guide_ids = ids
    b = q.shape[0]
    offset = 0 if axis_name is None else jax.lax.axis_index(axis_name) * b
    rows = offset + jnp.arange(b)  # global index of each local row
    q_all, d_all = _gather(q, axis_name), _gather(d, axis_name)
    masks = _example_masks(rows, jnp.arange(q_all.shape[0]), query_ids, doc_ids, guide_ids, axis_name)
    log_w = jnp.log(jnp.asarray(same_tower_weight, jnp.float32))
    s_qd = _scores(q, d_all, temperature)
    # Each local row's positive is its own local document: an elementwise product, no gather
    # from the [b, B] block (whose gradient would be a scatter into it).
    positive = jnp.einsum("bd,bd->b", q, d, preferred_element_type=jnp.float32) / temperature
    s_qn, neg_keep, neg_guided = _hard_negatives(q, negatives, doc_ids, negative_ids, guide_ids, temperature, axis_name)
    s_qq, s_dd, s_dq = _tower_blocks(q, d, q_all, d_all, s_qd, temperature, log_w, needs, axis_name)
    is_diagonal, cross_keep, same_keep, guided = masks
    guided_count = None
    if guide_ids is not None:
        guided_count = jnp.sum(guided) + (0 if neg_guided is None else jnp.sum(neg_guided))
    return _Logits(
        positive, s_qd, s_qn, s_qq, s_dd, s_dq, cross_keep, same_keep, neg_keep, is_diagonal, log_w, guided_count
    )


# ----------------------------------------------------------------------------------------------
# One function per mode: (loss, its metrics) from the shared blocks.
# ----------------------------------------------------------------------------------------------
def _softmax_term(positive, blocks):
    """(mean_i −positive_i + log Z_i, mean_i log Z_i) with log Z the masked logsumexp of `blocks`."""
    lse = masked_logsumexp(blocks)
    return jnp.mean(lse - positive), jnp.mean(lse)


def _query_to_doc_blocks(x: _Logits) -> list:
    """The cross-tower query->doc candidates: in-batch documents, then the hard negatives."""
    return [(x.s_qd, x.cross_keep)] + ([] if x.s_qn is None else [(x.s_qn, x.neg_keep)])


def _samtone_loss(x: _Logits, same_tower, bidirectional):
    """mode='samtone': the in-batch softmax, with same-tower negatives on the chosen side(s).

      ℓ_qd(i) = −S(q_i,p_i) + log[ Σ_j e^{S(q_i,p_j)} + Σ_{j,k} e^{S(q_i,n_jk)} + w·Σ_{j≠i} e^{S(q_i,q_j)} ]
      ℓ_dq(i) = −S(p_i,q_i) + log[ Σ_j e^{S(p_i,q_j)} + w·Σ_{j≠i} e^{S(p_i,p_j)} ]
      L = ½(mean ℓ_qd + mean ℓ_dq) if bidirectional else mean ℓ_qd

    The q·q sum is there for same_tower query|both, the d·d sum for doc|both.
    """
    qd_blocks = _query_to_doc_blocks(x)
    if same_tower in ("query", "both"):
        qd_blocks.append((x.s_qq, x.same_keep))
    loss, lse_qd = _softmax_term(x.positive, qd_blocks)
    metrics = {"logsumexp/query_to_doc": lse_qd}
    if bidirectional:
        dq_blocks = [(x.s_dq, x.cross_keep)]
        if same_tower in ("doc", "both"):
            dq_blocks.append((x.s_dd + x.log_w, x.same_keep))
        loss_dq, lse_dq = _softmax_term(x.positive, dq_blocks)
        loss = 0.5 * (loss + loss_dq)
        metrics["logsumexp/doc_to_query"] = lse_dq
    return loss, metrics


def _pair_loss(x: _Logits, same_tower, bidirectional, pair_alpha):
    """mode='pair' (Ren et al. 2021): the samtone loss plus PAIR's passage-centric term.

    ℓ_P(i) = −S(q_i,p_i) + log[ e^{S(q_i,p_i)} + Σ_{j≠i} e^{S(p_i,p_j)} ]
    L = (1−α)·L_samtone + α·mean ℓ_P
    """
    loss, metrics = _samtone_loss(x, same_tower, bidirectional)
    loss_p, lse_p = _softmax_term(x.positive, [(x.positive[:, None], None), (x.s_dd, x.same_keep)])
    metrics["logsumexp/passage_centric"] = lse_p
    return (1.0 - pair_alpha) * loss + pair_alpha * loss_p, metrics


def _gte_loss(x: _Logits):
    """mode='gte' (Li et al. 2023): one joint partition per pair, both directions and towers in it.

    Z_i = Σ_j e^{S(q_i,p_j)} + Σ_{j,k} e^{S(q_i,n_jk)} + Σ_j e^{S(p_i,q_j)}
          + w·Σ_{j≠i} e^{S(q_i,q_j)} + w·Σ_{j≠i} e^{S(p_i,p_j)}
    L = mean_i −S(q_i,p_i) + log Z_i
    """
    blocks = [*_query_to_doc_blocks(x), (x.s_dq, x.cross_keep), (x.s_qq, x.same_keep), (x.s_dd + x.log_w, x.same_keep)]
    loss, lse = _softmax_term(x.positive, blocks)
    return loss, {"logsumexp/joint": lse}


def _pairwise_loss(x: _Logits, axis_name):
    """mode='pairwise', STAR (Zhan et al. 2021): mean logistic loss over random plus over hard pairs.

      ℓ(q, p, n) = log(1 + e^{S(q,n) − S(q,p)})
      L = mean_{valid (i, j≠i)} ℓ(q_i, p_i, p_j) + mean_{valid (i, n)} ℓ(q_i, p_i, n)

    Each mean is over the global batch (sums and counts over all devices), 0 when empty.
    """
    random_keep = ~x.is_diagonal if x.cross_keep is None else x.cross_keep & ~x.is_diagonal
    parts = [("random", x.s_qd, random_keep)] + ([] if x.s_qn is None else [("hard", x.s_qn, x.neg_keep)])
    loss, metrics = jnp.zeros((), jnp.float32), {}
    for name, logits, keep in parts:
        keep = jnp.ones(logits.shape, bool) if keep is None else keep
        pair_loss = jnp.where(keep, jax.nn.softplus(logits - x.positive[:, None]), 0.0)
        total, count = jnp.sum(pair_loss), jnp.sum(keep).astype(jnp.float32)
        if axis_name is not None:
            total, count = jax.lax.psum(total, axis_name), jax.lax.psum(count, axis_name)
        mean = total / jnp.maximum(count, 1.0)
        loss = loss + mean
        metrics[f"pairwise/{name}"] = mean
    return loss, metrics


def _with_diagnostics(x: _Logits, loss, metrics, temperature, axis_name):
    """The metrics plus loss and the diagnostics over the query->doc candidates, float32, global means."""
    b, global_b = x.s_qd.shape
    off_diagonal = x.same_keep if x.cross_keep is None else x.cross_keep & ~x.is_diagonal
    hardest = jnp.max(_masked(x.s_qd, off_diagonal), axis=1)
    masked_count = jnp.zeros((), jnp.int32) if x.cross_keep is None else jnp.sum(~x.cross_keep)
    candidates = b * (global_b - 1)
    if x.s_qn is not None:
        hardest = jnp.maximum(hardest, jnp.max(_masked(x.s_qn, x.neg_keep), axis=1))
        masked_count += 0 if x.neg_keep is None else jnp.sum(~x.neg_keep)
        candidates += b * x.s_qn.shape[1]
    temperature = jnp.asarray(temperature, jnp.float32)
    metrics.update(
        loss=loss,
        accuracy=jnp.mean((x.positive > hardest).astype(jnp.float32)),
        positive_similarity=jnp.mean(x.positive) * temperature,
        hardest_negative_similarity=jnp.mean(jnp.where(jnp.isfinite(hardest), hardest, 0.0)) * temperature,
        masked_fraction=masked_count.astype(jnp.float32) / max(candidates, 1),
        temperature=temperature,
    )
    if x.guided_count is not None:
        metrics["guided_fraction"] = x.guided_count.astype(jnp.float32) / max(candidates, 1)
    metrics = {name: value.astype(jnp.float32) for name, value in metrics.items()}
    if axis_name is not None:
        metrics = jax.lax.pmean(metrics, axis_name)
    return metrics["loss"], metrics


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
    guide_ids: jax.Array | None = None,
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
      guide_ids: [B, G] integer document ids a teacher flags as false negatives of each row
        (needs doc_ids; see the module docstring); metrics then hold `guided_fraction`.
      same_tower_weight: w on the same-tower sums (1.0 in the paper; 0 disables them).
      axis_name: the mesh axis to gather columns over, inside `shard_map`.

    Returns:
      (loss: scalar float32, metrics: dict of scalar float32 — global means when sharded).
    """
    _check_options(mode, same_tower, bidirectional, temperature, same_tower_weight, pair_alpha)
    _check_arrays(q, d, negatives, query_ids, doc_ids, negative_ids, guide_ids)
    needs = _needed_blocks(mode, same_tower, bidirectional)
    ids = (query_ids, doc_ids, negative_ids, guide_ids)
    x = _logits(q, d, negatives, ids, temperature, same_tower_weight, needs, axis_name)
    if mode == "pairwise":
        loss, metrics = _pairwise_loss(x, axis_name)
    elif mode == "gte":
        loss, metrics = _gte_loss(x)
    elif mode == "pair":
        loss, metrics = _pair_loss(x, same_tower, bidirectional, pair_alpha)
    else:
        loss, metrics = _samtone_loss(x, same_tower, bidirectional)
    return _with_diagnostics(x, loss, metrics, temperature, axis_name)
