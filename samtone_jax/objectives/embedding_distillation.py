"""Embedding-level distillation: the student's embeddings matched to a teacher's, text by text.

Score-level distillation (distillation.py) needs a teacher's scores of each query's candidates. This
needs only texts: the teacher's embedding of every training text (`samtone encode` of the task with
the teacher: inputs.teacher_embeddings), so it also adapts a model to a corpus with no queries at all
(label-free: each text paired with itself, data/jsonl_pairs.py's "text" lines).

Notation: the global batch's B pairs, the student's L2-normalised q_i, d_i (width D_s) and the
teacher's t^q_i, t^d_i (width D_t, normalised here).

  mode='similarity'  the in-batch similarity matrices matched (any widths; the student keeps its own
                     space and learns the teacher's geometry of the batch):
                       L = mean over M in {qd, qq, dd} of mean_{i,j} (S^M_ij − T^M_ij)²
                     with S^qd_ij = q_i · d_j and T^qd_ij = t^q_i · t^d_j, and so on.
  mode='cosine'      each text's embedding matched to its teacher's (equal widths: a teacher of the
                     student's width, such as a fine-tuned run of the same base):
                       L = mean_i (2 − q_i · t^q_i − d_i · t^d_i) / 2
  mode='softmax'     the teacher's in-batch ranking as soft labels (any widths): each query's softmax
                     over the batch's documents at temperature τ, and each document's over the queries,
                     matched by KL divergence (listwise distillation, as score-level 'kl' does over a
                     query's scored candidates, here over the batch with no scoring pass):
                       L = mean over (qd, dq) of mean_i KL(softmax(T_i / τ) ‖ softmax(S_i / τ))
                     At the contrastive loss's τ its gradient is on the contrastive loss's scale, where
                     'similarity''s squared cosine gaps (about 1e-5) need a weight of about 100.

Each mode is a sum of per-row terms: sharded (`axis_name`, inside shard_map), each device scores its rows
(against the gathered batch, where a mode compares across it) and the sums are psum'd, so value and
gradient equal one device's with the whole batch. Computed in float32; the teacher's side carries no gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from samtone_jax.core.errors import BadValueError
from samtone_jax.objectives.distillation import listwise_kl, top1_agreement

MODES = ("similarity", "cosine", "softmax")
MATRICES = ("qd", "qq", "dd")
TEMPERATURE = 0.05  # 'softmax''s default τ: the recipe's contrastive τ (sentence-transformers' scale 20)
DIRECTIONS = ("qd", "dq")  # softmax: each query over the documents, each document over the queries


def _normalized(x: jax.Array) -> jax.Array:
    x = jax.lax.stop_gradient(x.astype(jnp.float32))
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def embedding_distillation(
    q: jax.Array,
    d: jax.Array,
    teacher_query: jax.Array,
    teacher_doc: jax.Array,
    *,
    mode: str = "similarity",
    temperature: float | None = None,
    axis_name: str | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(L of the module docstring, metrics) for this device's rows: q, d [b, D_s] L2-normalised,
    teacher_query, teacher_doc [b, D_t] (any scale); `temperature`: 'softmax''s τ (None: TEMPERATURE). Metrics:
    `embedding_distillation/<mode>` and, for 'similarity', the mean absolute gap of each matrix
    (`embedding_distillation/gap_<qd|qq|dd>`); for 'softmax', how often the student's top document
    (query) for a row is the teacher's (`embedding_distillation/top1_agreement`)."""
    temperature = _checked_temperature(mode, temperature)
    if q.ndim != 2 or d.shape != q.shape:
        raise BadValueError(f"embedding_distillation: q and d must both be [B, D]; got {q.shape} and {d.shape}")
    if teacher_query is None or teacher_doc is None:
        raise BadValueError(
            "objective.embedding_distillation_weight > 0 needs the teacher's embeddings of every training text: "
            "set inputs.teacher_embeddings to a `samtone encode --side=both` folder of the task, made with the teacher"
        )
    if teacher_query.shape[0] != q.shape[0] or teacher_doc.shape != teacher_query.shape:
        raise BadValueError(
            f"embedding_distillation: teacher embeddings {teacher_query.shape} / {teacher_doc.shape} do not match "
            f"the batch's {q.shape[0]} pairs"
        )
    q, d = q.astype(jnp.float32), d.astype(jnp.float32)
    tq, td = _normalized(teacher_query), _normalized(teacher_doc)
    if mode == "cosine":
        if tq.shape[1] != q.shape[1]:
            raise BadValueError(
                f"objective.embedding_distillation_mode = 'cosine' matches each embedding to the teacher's, so the "
                f"widths must be equal: the student's is {q.shape[1]}, the teacher's {tq.shape[1]}; use 'similarity' "
                "(any widths)"
            )
        total = jnp.sum(2.0 - jnp.sum(q * tq, axis=1) - jnp.sum(d * td, axis=1)) / 2
        count = jnp.asarray(q.shape[0], jnp.float32)
        if axis_name is not None:
            total, count = jax.lax.psum((total, count), axis_name)
        loss = total / count
        return loss, {"embedding_distillation/cosine": loss}

    def gathered(x):
        return x if axis_name is None else jax.lax.all_gather(x, axis_name, tiled=True)

    student = {"q": q, "d": d}
    teacher = {"q": tq, "d": td}
    if mode == "softmax":
        return _softmax_matched(student, teacher, temperature, gathered, axis_name)
    squares, gaps = [], {}
    for name in MATRICES:
        rows, cols = name
        gap = student[rows] @ gathered(student[cols]).T - teacher[rows] @ gathered(teacher[cols]).T  # [b, B]
        sums = jnp.sum(gap * gap), jnp.sum(jnp.abs(gap)), jnp.asarray(gap.size, jnp.float32)
        if axis_name is not None:
            sums = jax.lax.psum(sums, axis_name)
        squares.append(sums[0] / sums[2])
        gaps[f"embedding_distillation/gap_{name}"] = sums[1] / sums[2]
    loss = sum(squares) / len(squares)
    return loss, {"embedding_distillation/similarity": loss, **gaps}


def _checked_temperature(mode: str, temperature: float | None) -> float:
    """'softmax''s τ (None: TEMPERATURE), once the mode and τ are checked; τ given to another mode, which
    would ignore it, is refused."""
    if mode not in MODES:
        raise BadValueError(f"objective.embedding_distillation_mode = {mode!r} must be one of {MODES}")
    if temperature is None:
        return TEMPERATURE
    if mode != "softmax":
        raise BadValueError(
            f"objective.embedding_distillation_temperature = {temperature} is the 'softmax' mode's τ, and "
            f"objective.embedding_distillation_mode is {mode!r}: drop the temperature or set the mode to 'softmax'"
        )
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < 1e3:
        raise BadValueError(
            f"objective.embedding_distillation_temperature must be a number in (0, 1000) ('softmax''s τ, such as "
            f"the contrastive loss's 0.05); got {temperature!r}"
        )
    return temperature


def _softmax_matched(student, teacher, temperature, gathered, axis_name):
    """'softmax': per direction, the rows' KL(teacher ‖ student) of the in-batch softmaxes, summed here
    and psum'd; the mean over the global rows, then over the two directions."""
    kls, agreements = [], []
    for name in DIRECTIONS:
        r, c = name
        s = student[r] @ gathered(student[c]).T / temperature  # [b, B]
        t = teacher[r] @ gathered(teacher[c]).T / temperature
        sums = jnp.sum(listwise_kl(s, t)), jnp.sum(top1_agreement(s, t)), jnp.asarray(s.shape[0], jnp.float32)
        if axis_name is not None:
            sums = jax.lax.psum(sums, axis_name)
        kls.append(sums[0] / sums[2])
        agreements.append(sums[1] / sums[2])
    loss = sum(kls) / len(kls)
    return loss, {
        "embedding_distillation/softmax": loss,
        "embedding_distillation/top1_agreement": sum(agreements) / len(agreements),
    }


def matched(loss_fn, weight: float, mode: str = "similarity", temperature: float | None = None):
    """A step loss taking `teacher_query` / `teacher_doc` [B, D_t]: loss_fn(...) (contrastive_loss's
    signature, or an objective built on it; None: no other term, as label-free adaptation trains)
    + weight · embedding_distillation(...) (`temperature`: 'softmax''s τ, None: TEMPERATURE). Metrics: loss_fn's, the
    term's, `embedding_distillation/loss` and `loss`, the sum."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
        raise BadValueError(f"objective.embedding_distillation_weight must be a number > 0 here; got {weight!r}")
    _checked_temperature(mode, temperature)  # refused when the loss is built, not at its first step

    def loss(q, d, *, teacher_query=None, teacher_doc=None, axis_name=None, **kwargs):
        term, metrics = embedding_distillation(
            q, d, teacher_query, teacher_doc, mode=mode, temperature=temperature, axis_name=axis_name
        )
        total = weight * term
        if loss_fn is not None:
            value, other = loss_fn(q, d, axis_name=axis_name, **kwargs)
            metrics = {**other, **metrics}
            total = total + value
        return total, {**metrics, "embedding_distillation/loss": term, "loss": total}

    return loss
