"""The step's loss from gin's objective.* groups: the contrastive loss (at each quantized precision, over
Matryoshka's nested dimensions), score distillation, embedding distillation and the spread-out term,
composed in that order; a setting the composed loss would ignore is refused."""

from __future__ import annotations

from samtone_jax.core.errors import BadValueError
from samtone_jax.data.input_spec import InputSpec
from samtone_jax.objectives import distillation, embedding_distillation, matryoshka, quantization_aware, spread_out
from samtone_jax.training.settings import ObjectiveSettings


def training_loss(loss_fn, distill_fn, spec: InputSpec, terms: ObjectiveSettings, teacher_embeddings=None):
    """The step's loss from gin's objective.*: `loss_fn` (at each of objective.quantized_precisions;
    over the nested dimensions of objective.matryoshka_dims), with the distillation term when
    objective.distillation_weight > 0, plus objective.spread_out_weight × the spread-out term of
    the full embeddings (whatever the other terms' weights), plus objective.embedding_distillation_weight ×
    the match to the teacher's embeddings (`teacher_embeddings`: inputs.teacher_embeddings); settings that
    would be ignored are refused."""
    if terms.quantized_precisions:
        loss_fn = quantization_aware.aware(loss_fn, terms.quantized_precisions, terms.quantized_weights)
    elif terms.quantized_weights:
        raise BadValueError(
            "objective.quantized_weights needs objective.quantized_precisions (the precisions they weigh)"
        )
    if terms.matryoshka_dims:
        loss_fn = matryoshka.nested(loss_fn, terms.matryoshka_dims, terms.matryoshka_weights)
    elif terms.matryoshka_weights:
        raise BadValueError(
            "objective.matryoshka_weights needs objective.matryoshka_dims (the nested dimensions they weigh)"
        )
    if spec.guide is not None and not terms.contrastive_weight:
        raise BadValueError(
            "inputs.teacher_guide removes negatives from the contrastive loss, which objective.contrastive_weight = 0 "
            "turns off: drop the guide or give the contrastive loss a weight"
        )
    if terms.embedding_distillation_weight and not terms.distillation_weight:
        objective = _beside_the_teacher(loss_fn, spec, terms)
    else:
        objective = distillation.objective(
            loss_fn,
            distill_fn,
            spec.teacher_scores,
            spec.num_negatives,
            terms.contrastive_weight,
            terms.distillation_weight,
        )
    if terms.embedding_distillation_weight:
        if teacher_embeddings is None:
            raise BadValueError(
                "objective.embedding_distillation_weight > 0 needs inputs.teacher_embeddings: the teacher's "
                "`samtone encode --side=both` folder of the task"
            )
        objective = embedding_distillation.matched(
            objective,
            terms.embedding_distillation_weight,
            terms.embedding_distillation_mode,
            terms.embedding_distillation_temperature,
        )
    elif teacher_embeddings is not None:
        raise BadValueError(
            "inputs.teacher_embeddings is set but objective.embedding_distillation_weight is 0: give the term a "
            "weight (> 0) or drop the teacher's folder"
        )
    return spread_out.regularized(objective, terms.spread_out_weight) if terms.spread_out_weight != 0 else objective


def _beside_the_teacher(loss_fn, spec: InputSpec, terms: ObjectiveSettings):
    """The contrastive term beside embedding distillation (no score distillation): contrastive_weight ×
    loss_fn, or None at weight 0 (label-free adaptation: the teacher's term alone), where what only
    the contrastive term reads is refused."""
    if spec.teacher_scores:
        raise BadValueError(
            "inputs.teacher_scores are read by score distillation (objective.distillation_weight > 0), not by "
            "objective.embedding_distillation_weight: drop them or give score distillation a weight"
        )
    if terms.contrastive_weight == 1.0:
        return loss_fn
    if terms.contrastive_weight:

        def scaled(q, d, **kwargs):
            value, metrics = loss_fn(q, d, **kwargs)
            return terms.contrastive_weight * value, {**metrics, "contrastive_loss": value}

        return scaled
    unused = {
        "objective.matryoshka_dims": terms.matryoshka_dims,
        "objective.quantized_precisions": terms.quantized_precisions,
        "inputs.num_negatives": spec.num_negatives,
    }
    named = [name for name, value in unused.items() if value]
    if named:
        raise BadValueError(
            f"{', '.join(named)} shape the contrastive loss, which objective.contrastive_weight = 0 turns off (the "
            "teacher's embeddings alone): drop them or give the contrastive loss a weight"
        )
    return None
