"""The registry of tower families (models/family.py says what a family is). Adding a family is its
folder under models/ and one line here."""

from __future__ import annotations

from samtone_jax.core.errors import BadValueError, CheckpointMismatchError
from samtone_jax.models.bert.family import FAMILY as BERT
from samtone_jax.models.distilbert.family import FAMILY as DISTILBERT
from samtone_jax.models.family import TowerFamily
from samtone_jax.models.modernbert.family import FAMILY as MODERNBERT
from samtone_jax.models.mpnet.family import FAMILY as MPNET
from samtone_jax.models.roberta.family import FAMILY as ROBERTA
from samtone_jax.models.t5.family import FAMILY as T5

FAMILIES: tuple[TowerFamily, ...] = (T5, BERT, MPNET, ROBERTA, DISTILBERT, MODERNBERT)
DEFAULT = T5  # the family of a saved model config that binds no tower config (all of T5Config's defaults)


def of(config) -> TowerFamily:
    """The family of a tower config (a T5Config, a BertConfig, ...)."""
    for family in FAMILIES:
        if type(config) is family.config_class:
            return family
    raise BadValueError(f"{type(config).__name__} is no tower family's config; families: {names()}")


def by_gin_name(name: str) -> TowerFamily:
    """The family whose config gin binds as `name` ('T5Config', 'BertConfig')."""
    for family in FAMILIES:
        if family.gin_name == name:
            return family
    raise BadValueError(f"{name!r} is no tower family's config; one of {[f.gin_name for f in FAMILIES]}")


def for_model_type(model_type: str | None, where: str) -> TowerFamily | None:
    """The family that imports a Hugging Face config.json's model_type (None: no model_type, as in
    T5X-converted folders: no family claims it); a type no family reads is refused, naming the ones that do."""
    if model_type is None:
        return None
    for family in FAMILIES:
        if model_type in family.hf_model_types:
            return family
    supported = ", ".join(f"{t} ({f.display})" for f in FAMILIES for t in f.hf_model_types)
    raise CheckpointMismatchError(
        f"{where}: model_type {model_type!r}, which no tower family here loads; supported: {supported}"
    )


def names() -> list[str]:
    return [family.name for family in FAMILIES]
