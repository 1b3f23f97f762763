"""What a training run reads that train.fit checks before MODEL_DIR is written, beyond the data and
the vocabulary (TrainInputs.check_data, vocab.check_fits): INIT_CHECKPOINT's completeness and
parameter shapes, and the moving average a resumed run's checkpoints hold. One line each, naming
the gin setting and what to do."""

from __future__ import annotations

import logging

import flax.linen as nn
import jax

from samtone_jax.core import paths, run_folders
from samtone_jax.core.errors import BadValueError
from samtone_jax.models import init_params, lora

log = logging.getLogger(__name__)


def init_checkpoint_fits(init_checkpoint: str | None, model, model_dir) -> None:
    """A fresh run's INIT_CHECKPOINT exists, is complete, and (a parameter checkpoint or another run)
    has this model's parameter shapes, read from its saved metadata: one line before MODEL_DIR is
    written, not at the first step. A run that resumes reads its own checkpoint instead."""
    if not init_checkpoint or run_folders.complete_steps(model_dir):
        return
    from samtone_jax.checkpoints import reader
    from samtone_jax.checkpoints.train_checkpoints import first_shape_difference, saved_tree

    kind, directory, step = reader.resolve(init_checkpoint)
    if kind != "train":  # a run writing into an import or export folder would mix them
        paths.check_not_input(model_dir, [("train.init_checkpoint", directory)], "train.model_dir", refuse=("is",))
    if kind == "export":  # a Hugging Face folder: its shapes are checked as it is imported
        return
    if kind == "train":
        tree = saved_tree(run_folders.state(directory, step))
        tree = None if tree is None else tree.get("params")
    else:
        tree = saved_tree(paths.as_path(directory) / run_folders.PARAMS)
    if tree is None:  # unreadable metadata: the restore names it
        return
    abstract = jax.eval_shape(lambda: nn.unbox(init_params(model, jax.random.PRNGKey(0))))
    adapters = lora.adapter_keys(model)
    if adapters and not any(k in tree for k in adapters):  # a plain model's: the LoRA model's frozen part
        abstract = {k: v for k, v in abstract.items() if k not in adapters}
    elif adapters:  # another LoRA model's trained part (its tower: its base.json's, checked when read)
        abstract = {k: v for k, v in abstract.items() if k in tree or k not in lora.frozen_keys(model)}
    differ = first_shape_difference(abstract, tree)
    if differ is not None:
        name, ours, theirs = differ
        raise BadValueError(
            f"train.init_checkpoint={init_checkpoint!r} does not fit the gin model (architecture "
            f"{model.architecture}): its {name} is {theirs}, the model's {ours}; use the same "
            "architectures/ and models/ gin files as the run that wrote it"
        )


def ema_matches(ema_decay: float | None, model_dir) -> None:
    """step.ema_decay in (0, 1); a run resumes with the moving average iff its checkpoints hold one
    (its decay may change; turning it on or off mid-run would drop or invent its history)."""
    if ema_decay is not None and not 0.0 < ema_decay < 1.0:
        raise BadValueError(f"step.ema_decay must lie in (0, 1), e.g. 0.999 (None: no moving average); got {ema_decay}")
    steps = run_folders.complete_steps(model_dir)
    if not steps:
        return
    from samtone_jax.checkpoints.train_checkpoints import saved_tree

    tree = saved_tree(run_folders.state(model_dir, steps[-1]))
    if tree is None:  # unreadable: restore_latest falls back to an earlier step or says what to do
        return
    saved = "ema" in tree
    if saved != (ema_decay is not None):
        raise BadValueError(
            f"{model_dir}'s checkpoints were saved {'with' if saved else 'without'} a moving average of the "
            f"parameters, and step.ema_decay = {ema_decay} here: resume as it was trained "
            f"({'set step.ema_decay' if saved else 'step.ema_decay = None'}), or start another MODEL_DIR"
        )


def lora_base(model, init_checkpoint: str | None, model_dir) -> str | None:
    """Where a LoRA run's frozen tower is (None without LoRA): a resumed run's base.json, else
    INIT_CHECKPOINT's tower (its own base.json when it is another LoRA run, else itself, a run
    pinned to its step), as an absolute path or gs:// URL."""
    if not model.lora_rank:
        return None
    from samtone_jax.checkpoints import reader

    reference = paths.as_path(model_dir) / run_folders.BASE
    if reference.exists() and run_folders.complete_steps(model_dir):
        return reader.base_of(model_dir, required=True)
    if not init_checkpoint:
        raise BadValueError(
            f"DualEncoder.lora_rank={model.lora_rank}: LoRA trains adapters over a pretrained tower it keeps frozen; "
            "name that tower's checkpoint in train.init_checkpoint (an import, a run or an export)"
        )
    base = reader.base_of(init_checkpoint)
    if run_folders.kind(base) == "step":
        log.warning(
            "the frozen tower of this LoRA run is step %s of the run %s (base.json): keep that step (that run's "
            "schedule.keep_checkpoints may delete it), or `samtone average`/import it into a parameter checkpoint "
            "first",
            paths.as_path(base).name,
            paths.as_path(base).parent.parent,
        )
    return base
