"""The lengths a model is served at, kept apart from the lengths it was trained at.

A fine-tune runs at short lengths for speed (all-MiniLM-L6-v2 at 32 / 48 tokens), but the model it
started from read 256 (its sentence-transformers max_seq_length): serving the fine-tuned model at its
training lengths would silently truncate every longer document the base model read. So a model
carries its serving lengths as gin `serving.query_length` / `serving.doc_length`:

  import-checkpoint  the source's lengths (sentence-transformers' max_seq_length, capped by positions)
  train              the INIT_CHECKPOINT's serving lengths (its train.* ones when it has none), unless
                     serving.* is set; a run from scratch is served at its training lengths
  average, export    copied with the model's settings (an export's samtone.json: query_length /
                     doc_length, and training_lengths beside them)

`samtone_jax.load`, `eval`, `encode` and `export` use the serving lengths unless told otherwise, and
eval records say which lengths they used.
"""

from __future__ import annotations

import logging

import gin

log = logging.getLogger(__name__)

DEFAULT = (64, 128)  # what a model that records no lengths at all is served at


@gin.configurable("serving")
def serving(query_length: int | None = None, doc_length: int | None = None) -> tuple[int | None, int | None]:
    """The gin names of the serving lengths (a model's settings hold them; nothing calls this)."""
    return query_length, doc_length


def training_lengths(settings: dict) -> tuple[int | None, int | None]:
    return settings.get("train.query_length"), settings.get("train.doc_length")


def of_settings(settings: dict) -> tuple[int, int]:
    """(query, document) serving lengths of a model's saved settings (gin_config.read_bindings of its
    config.gin / model.gin): serving.* where set, else its training lengths, else DEFAULT."""
    train_q, train_d = training_lengths(settings)
    query = settings.get("serving.query_length") or train_q or DEFAULT[0]
    document = settings.get("serving.doc_length") or train_d or DEFAULT[1]
    return int(query), int(document)


def _bound(name: str):
    try:
        return gin.query_parameter(name)
    except ValueError:
        return None


def current(training: tuple[int, int]) -> tuple[int, int]:
    """The serving lengths the parsed gin config binds (after `inherit`), else `training`."""
    return _bound("serving.query_length") or training[0], _bound("serving.doc_length") or training[1]


def inherit(init_checkpoint: str | None) -> dict[str, int]:
    """Bind serving.* (unless the config sets them) to the serving lengths of the model training starts
    from, so a run fine-tuned at short lengths is served as its base was; returns what was bound."""
    if not init_checkpoint or (_bound("serving.query_length") and _bound("serving.doc_length")):
        return {}
    from samtone_jax.checkpoints import reader

    settings = reader.settings(init_checkpoint)
    if not settings:
        return {}
    query, document = of_settings(settings)
    bound = {}
    with gin.unlock_config():
        for name, value in (("serving.query_length", query), ("serving.doc_length", document)):
            if not _bound(name):
                gin.bind_parameter(name, value)
                bound[name] = value
    if bound:
        log.info("served at the lengths of %s: %s (training lengths apply only to training)", init_checkpoint, bound)
    return bound
