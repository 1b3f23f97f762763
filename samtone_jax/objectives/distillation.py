"""Distillation losses: the student's scores of each query's own candidates against a teacher's.

Notation as in losses.py: B pairs (q_i, p_i), K hard negatives n_ik per pair (the candidates the
teacher scored, `samtone score`), s(a, b) = a·b of L2-normalised embeddings. Per row i the
student's logits are S_i = [s(q_i, p_i), s(q_i, n_i1), ..., s(q_i, n_iK)] / τ_s and the
teacher's T_i = t_i / τ_t, from `teacher_scores` t [B, 1 + K] (the positive's score first).

  mode='margin_mse'  L = mean_{i,k} ((S_i0 − S_ik) − (T_i0 − T_ik))²
                     MarginMSE (Hofstätter et al. 2020, "Improving Efficient Neural Ranking
                     Models with Cross-Architecture Knowledge Distillation"): the student matches
                     the teacher's positive-negative margins, not its scale. τ_s and τ_t put the
                     two on one scale (a cosine margin is at most 2; a BM25 margin can be 20).
  mode='kl'          L = mean_i KL(softmax(T_i) ‖ softmax(S_i))
                     listwise distillation over each query's 1 + K candidates (as RocketQAv2,
                     sentence-transformers' DistillKLDiv): soft labels from the teacher.

Both are sums of per-row terms over the row's own candidates, so the sharded form (inside
`shard_map` with `axis_name`, each device its B / D rows) is the mean of the devices' local means,
exactly the single-device value; nothing is gathered. Computed in float32 whatever the input
dtype; the KL's log-softmaxes are max-subtracted, so τ_s = 0.01 cannot overflow.

train.py combines either with the contrastive loss: L = contrastive_weight · L_contrastive +
distillation_weight · L_distill (gin `train.*`; losses/distill_*.gin).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from samtone_jax.core.errors import BadValueError

MODES = ("margin_mse", "kl")


def _check(q, d, negatives, teacher_scores, mode, temperature, teacher_temperature):
    if mode not in MODES:
        raise BadValueError(f"distillation_loss: mode={mode!r} must be one of {MODES}")
    for name, value in (("temperature", temperature), ("teacher_temperature", teacher_temperature)):
        if isinstance(value, (int, float)) and not value > 0:
            raise BadValueError(f"distillation_loss: {name} must be > 0; got {value}")
    if q.ndim != 2 or d.shape != q.shape:
        raise BadValueError(f"distillation_loss: q and d must both be [B, D]; got q {q.shape}, d {d.shape}")
    b, dim = q.shape
    if negatives is None or negatives.ndim != 3 or negatives.shape[0] != b or negatives.shape[2] != dim:
        got = None if negatives is None else negatives.shape
        raise BadValueError(
            f"distillation_loss needs the teacher's candidates as negatives [B, K, D] = [{b}, K, {dim}]; got {got} "
            "(set inputs.num_negatives > 0 and hard_negatives_file.path to a `samtone score` file)"
        )
    want = (b, 1 + negatives.shape[1])
    if teacher_scores is None or tuple(teacher_scores.shape) != want:
        got = None if teacher_scores is None else tuple(teacher_scores.shape)
        raise BadValueError(
            f"distillation_loss: teacher_scores must be [B, 1 + K] = {list(want)} (the positive's score first); "
            f"got {got}"
        )


def student_logits(q, d, negatives, temperature) -> jax.Array:
    """[B, 1 + K] float32: s(q_i, p_i) then s(q_i, n_ik), over τ_s."""
    positive = jnp.einsum("bd,bd->b", q, d, preferred_element_type=jnp.float32)
    hard = jnp.einsum("bd,bkd->bk", q, negatives, preferred_element_type=jnp.float32)
    return jnp.concatenate([positive[:, None], hard], axis=1) / temperature


def listwise_kl(student: jax.Array, teacher: jax.Array) -> jax.Array:
    """[b]: each row's KL(softmax(teacher) ‖ softmax(student)) of [b, n] logits (log-softmaxes
    max-subtracted)."""
    log_p_t = jax.nn.log_softmax(teacher, axis=1)
    log_p_s = jax.nn.log_softmax(student, axis=1)
    return jnp.sum(jnp.exp(log_p_t) * (log_p_t - log_p_s), axis=1)


def top1_agreement(student: jax.Array, teacher: jax.Array) -> jax.Array:
    """[b] float32: 1 where a row's top entry is the same in the student's and teacher's logits."""
    return (jnp.argmax(student, axis=1) == jnp.argmax(teacher, axis=1)).astype(jnp.float32)


def distillation_loss(
    q: jax.Array,
    d: jax.Array,
    negatives: jax.Array,
    teacher_scores: jax.Array,
    *,
    mode: str = "margin_mse",
    temperature: float = 1.0,
    teacher_temperature: float = 1.0,
    axis_name: str | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The distillation loss of the module docstring, and its metrics.

    Args:
      q, d: [B, D] L2-normalised query and positive-document embeddings (local shard with
        `axis_name`); negatives: [B, K, D], the candidates the teacher scored.
      teacher_scores: [B, 1 + K] the teacher's scores of (q_i, p_i), then of (q_i, n_ik).
      temperature, teacher_temperature: τ_s and τ_t (> 0; τ_s may be a traced scalar).

    Returns:
      (loss: scalar float32, metrics: `distill/<mode>` and `distill/teacher_agreement`, the
      fraction of rows whose top candidate is the same for student and teacher; global means).
    """
    _check(q, d, negatives, teacher_scores, mode, temperature, teacher_temperature)
    student = student_logits(q, d, negatives, temperature)
    teacher = jax.lax.stop_gradient(teacher_scores.astype(jnp.float32)) / teacher_temperature
    if mode == "margin_mse":
        margins_s = student[:, :1] - student[:, 1:]
        margins_t = teacher[:, :1] - teacher[:, 1:]
        loss = jnp.mean(jnp.square(margins_s - margins_t))
    else:
        loss = jnp.mean(listwise_kl(student, teacher))
    agreement = jnp.mean(top1_agreement(student, teacher))
    metrics = {f"distill/{mode}": loss, "distill/teacher_agreement": agreement}
    if axis_name is not None:
        loss, metrics = jax.lax.pmean((loss, metrics), axis_name)
    return loss, metrics


def with_distillation(loss_fn, distill_fn, contrastive_weight: float = 1.0, distillation_weight: float = 1.0):
    """A loss with contrastive_loss's signature plus `teacher_scores`: contrastive_weight ·
    loss_fn(...) + distillation_weight · distill_fn(q, d, negatives, teacher_scores, ...). The
    contrastive term is not computed when its weight is 0 (pure distillation); metrics hold both
    terms (`contrastive_loss`, `distillation_loss`) and `loss`, the weighted sum. A learnable
    temperature is the contrastive loss's; the distillation's τ_s is its own (gin)."""
    if contrastive_weight < 0 or distillation_weight < 0 or contrastive_weight == distillation_weight == 0:
        raise BadValueError(
            f"objective.contrastive_weight={contrastive_weight} and "
            f"objective.distillation_weight={distillation_weight} "
            "must be >= 0 and not both 0"
        )

    def loss(q, d, *, negatives=None, teacher_scores=None, axis_name=None, **kwargs):
        distill, metrics = distill_fn(q, d, negatives, teacher_scores, axis_name=axis_name)
        metrics = dict(metrics, distillation_loss=distill)
        total = distillation_weight * distill
        if contrastive_weight:
            contrastive, contrastive_metrics = loss_fn(q, d, negatives=negatives, axis_name=axis_name, **kwargs)
            metrics.update(contrastive_metrics, contrastive_loss=contrastive)
            total = total + contrastive_weight * contrastive
        metrics["loss"] = total
        return total, metrics

    return loss


def objective(loss_fn, distill_fn, teacher_scores: bool, num_negatives: int, contrastive_weight, distillation_weight):
    """The training step's loss from gin's train.*: `loss_fn` alone, or with the distillation term
    (objective.distillation_weight > 0); settings that would be ignored are refused."""
    if not distillation_weight:
        if teacher_scores or contrastive_weight != 1.0:
            raise BadValueError(
                "inputs.teacher_scores / objective.contrastive_weight only matter with "
                "objective.distillation_weight > 0 "
                "(include one of losses/distill_*.gin)"
            )
        return loss_fn
    if not teacher_scores or not num_negatives or distill_fn is None:
        raise BadValueError(
            "objective.distillation_weight > 0 needs inputs.teacher_scores = True, inputs.num_negatives > 0 "
            "(the scored "
            "candidates) and hard_negatives_file.path set to a `samtone score` file"
        )
    return with_distillation(loss_fn, distill_fn, contrastive_weight, distillation_weight)
