"""The folders this project writes, by name: every reader and writer asks this module.

  MODEL_DIR (`samtone train`, `samtone train-adore`)
    config.gin              the run's gin config (written at start; a resume checks its model)
    operative_config.gin    what the run used (written at the end, as T5X does)
    vocab.model             the SentencePiece model the run trained with (a copy), or
    tokenizer.json          a BERT-family tower's Hugging Face tokenizer (a copy)
    lock.json               the lease of the run that holds MODEL_DIR (run_lock.py)
    checkpoints/<step>/     orbax: state/ {step, params, opt_state, rng} and meta/ {data position}
    base.json               a LoRA run's frozen tower: {"path": the checkpoint that holds it, "fingerprint"} (its
                            checkpoints hold only what it trains)
    train/, eval/           TensorBoard events; eval/ also `samtone eval`'s <task>_<split>_step<N>.json
    eval.json               the demo's table
  a parameter checkpoint (`samtone import-checkpoint`, `samtone average`, `export --format=adapter`)
    params/, model.gin, info.json (+ vocab.model or tokenizer.json, + base.json when it holds a LoRA
    model's trained part only), commit_success.txt
  an export (`samtone export`)
    samtone.json, model.gin, spiece.model, README.md, the model's files, commit_success.txt

A step of a run is complete when orbax finalised it (renamed into place on local disk; on gs://
written in place) and its commit_success.txt, which orbax writes last in both cases, is there. The
marker is required on local disk too: a local copy of a gs:// run taken mid-save has a step folder
with a final name and no marker, which orbax's local rule alone would take as complete.
"""

from __future__ import annotations

from samtone_jax.core import paths

# MODEL_DIR
CONFIG_GIN = "config.gin"
CONFIG_HISTORY = "config_history"  # each earlier config.gin of a run resumed with other settings
OPERATIVE_CONFIG_GIN = "operative_config.gin"
VOCABULARY = "vocab.model"
TOKENIZER = "tokenizer.json"
CALIBRATION = "calibration.json"  # int8 ranges per served dimension (calibration.py), run / params / export
GUARD = "guard.json"  # the guard's starting-model scores (evaluation/guard.py), in MODEL_DIR
BASE = "base.json"  # {"path", "fingerprint"}: where a LoRA model's frozen tower is, and which (run / params)
LOCK = "lock.json"
CHECKPOINTS = "checkpoints"
STATE, META = "state", "meta"  # the items of one checkpoint step
TRAIN_EVENTS, EVAL = "train", "eval"
DEMO_RESULTS = "eval.json"

# a parameter checkpoint
PARAMS = "params"
MODEL_GIN = "model.gin"
INFO_JSON = "info.json"

# an export
EXPORT_JSON = "samtone.json"
EXPORT_VOCABULARY = "spiece.model"
MODEL_CARD = "README.md"

COMMIT_MARKER = "commit_success.txt"  # a complete folder (atomic_file.py); orbax's name for the same


def checkpoints(model_dir) -> paths.Path:
    return paths.as_path(model_dir) / CHECKPOINTS


def state(model_dir, step: int) -> paths.Path:
    """MODEL_DIR/checkpoints/<step>/state: the orbax tree of one step."""
    return checkpoints(model_dir) / str(step) / STATE


def complete_steps(model_dir) -> list[int]:
    """The complete steps saved under MODEL_DIR/checkpoints (local or gs://), ascending."""
    import orbax.checkpoint as ocp

    directory = checkpoints(model_dir)
    if not directory.is_dir():
        return []
    # orbax's finalized step folders; only our own name format (<step>), not orbax's prefixed ones
    found = ocp.path.step.checkpoint_steps_paths(directory)
    return sorted(int(p.name) for p in found if p.name.isdigit() and (p / COMMIT_MARKER).exists())


def is_step(path) -> bool:
    """Whether `path` is one step of a run (MODEL_DIR/checkpoints/<step>), complete or not."""
    path = paths.as_path(path)
    return path.name.isdigit() and (path / STATE).is_dir()


def is_complete_step(path) -> bool:
    import orbax.checkpoint as ocp

    path = paths.as_path(path)
    return ocp.path.step.is_path_finalized(path) and (path / COMMIT_MARKER).exists()


def kind(path) -> str | None:
    """'step' | 'run' | 'params' | 'export' for a folder this project wrote, else None."""
    path = paths.as_path(path)
    if is_step(path):
        return "step"
    if (path / CHECKPOINTS).is_dir():
        return "run"
    if (path / PARAMS).is_dir():
        return "params"
    if (path / EXPORT_JSON).exists():
        return "export"
    return None
