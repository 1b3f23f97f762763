"""Any checkpoint by its path: what the path holds (`resolve`: a run, one of its steps, a parameter
checkpoint, an export), the parameters it holds for a model (`checkpoint_params`), and a LoRA
checkpoint's frozen tower, which it does not hold (`base_of`: where its base.json says the tower is;
`with_base`: the parameters completed from there)."""

from __future__ import annotations

import json
import os

from samtone_jax.core import paths, run_folders
from samtone_jax.core.atomic_file import require_complete
from samtone_jax.core.errors import BadValueError, MissingFileError


def checkpoint_params(path: str, model, placed=None) -> dict:
    """The parameters for `model` that the checkpoint at `path` holds (anything `resolve` takes: a
    parameter checkpoint, a run's latest step or a given one, an export of a BERT / T5 tower), with a
    LoRA model's frozen tower from the checkpoint's base.json when it holds only the trained part.
    `placed` ({key: ShapeDtypeStructs with shardings}): a parameter checkpoint's keys restored
    straight onto devices (those it holds)."""
    import jax

    from samtone_jax.checkpoints.importer import import_params
    from samtone_jax.checkpoints.params_io import load_params, restore_part
    from samtone_jax.checkpoints.train_checkpoints import saved_tree
    from samtone_jax.models.lora import base_model

    kind, directory, step = resolve(path)
    if kind == "params":
        target = None
        if placed is not None:
            held = saved_tree(paths.as_path(directory) / run_folders.PARAMS) or placed
            target = {k: v for k, v in placed.items() if k in held}
        params = load_params(directory, target)
    elif kind == "train":  # its params only (not the optimizer state), onto `placed` or this host's device
        state = run_folders.state(directory, step)
        saved = saved_tree(state)
        if saved is None:
            raise MissingFileError(f"{state}: its metadata cannot be read (an incomplete or damaged checkpoint)")
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = {
            k: placed[k]
            if placed is not None and k in placed
            else jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), v)
            for k, v in saved["params"].items()
        }
        params = restore_part(state, {"params": target})["params"]
    else:
        params, _ = import_params("hf", directory, base_model(model))
    return with_base(params, model, directory, placed)


def with_base(params: dict, model, directory, placed=None) -> dict:
    """`params` with the LoRA model's frozen tower added from the checkpoint its folder's base.json
    names, when they lack it (a LoRA run's checkpoints and adapter exports hold only what is trained)."""
    from samtone_jax.models.lora import base_model, frozen_keys

    missing = [k for k in frozen_keys(model) if k not in params]
    if not missing:
        return params
    base = base_of(directory, required=True)

    plain = base_model(model)
    subset = None if placed is None else {k: placed[k] for k in missing if k in placed}
    tower = checkpoint_params(base, plain, subset)
    return dict(params) | {k: tower[k] for k in missing}


def base_of(checkpoint: str, required: bool = False) -> str | None:
    """Where the frozen tower of a LoRA checkpoint is: its folder's base.json, checked against the
    fingerprint recorded there (a tower replaced at that path is refused, naming both); else (a plain
    checkpoint, which holds its tower) the checkpoint itself, as an absolute path or gs:// URL (a
    run's: its latest step folder). `required`: a folder without base.json is an error."""
    root = paths.as_path(checkpoint)
    if run_folders.kind(root) == "step":
        root = root.parent.parent
    reference = root / run_folders.BASE
    if reference.exists():
        try:
            record = json.loads(reference.read_text())
            base = record["path"]
        except (ValueError, KeyError, TypeError) as e:
            raise BadValueError(
                f"{reference} is damaged ({e}): it should be {{'path': <the frozen tower's checkpoint>}}"
            ) from e
        if not paths.as_path(base).exists():
            raise MissingFileError(
                f"the frozen tower of {checkpoint} is gone: {base}, named in {reference}, does not exist; put that "
                "checkpoint back at that path (the adapters were trained on it and only work with it)"
            )
        recorded = record.get("fingerprint")
        if recorded is not None:
            now = fingerprint(base)
            if now != recorded:
                raise BadValueError(
                    f"the frozen tower of {checkpoint} was replaced: {reference} names {base} with fingerprint "
                    f"{recorded}, and what is there now has fingerprint {now} (another model, or the same one written "
                    "again); put the original back, or train the adapters again on the new tower (if it holds the very "
                    f'same weights, remove the "fingerprint" entry of {reference} to accept it)'
                )
        return base
    if required:
        raise MissingFileError(
            f"{checkpoint} holds a LoRA model's adapters without its frozen tower, and no {run_folders.BASE} naming "
            "where that tower is"
        )
    kind, directory, step = resolve(checkpoint)  # a run: pinned to its step (it may train on)
    where = paths.as_str(run_folders.checkpoints(directory) / str(step)) if kind == "train" else directory
    return where if paths.is_remote(where) else os.path.abspath(where)


def base_record(base: str) -> bytes:
    """base.json's content for a LoRA model whose frozen tower is the checkpoint `base`: its path and
    fingerprint (checked by `base_of` whenever the tower is read)."""
    return json.dumps({"path": base, "fingerprint": fingerprint(base)}).encode()


# What a checkpoint's fingerprint hashes: files that are written anew, with a new time in them, whenever
# the parameters are saved (orbax's _CHECKPOINT_METADATA holds its commit time, our commit marker its
# own), the saved tree's metadata, and what completes the parameters (a LoRA model's base.json).
_FINGERPRINTED = {
    "train": ("checkpoints/{step}/_CHECKPOINT_METADATA", "checkpoints/{step}/state/_METADATA", run_folders.BASE),
    "params": (
        f"{run_folders.PARAMS}/_CHECKPOINT_METADATA",
        f"{run_folders.PARAMS}/_METADATA",
        run_folders.COMMIT_MARKER,
        run_folders.BASE,
    ),
    "export": (run_folders.COMMIT_MARKER, run_folders.EXPORT_JSON),
}


def fingerprint(path: str, step: int | None = None) -> str:
    """A short fingerprint of the parameters the checkpoint at `path` holds: it changes whenever they
    are written again (another training to the same step, another import at the same path), read
    from a few small files (not the parameters' bytes: an XXL model's are 44 GB)."""
    import hashlib

    kind, directory, step = resolve(path, step)
    root = paths.as_path(directory)
    digest = hashlib.sha256(f"{kind} {step}".encode())
    for name in _FINGERPRINTED[kind]:
        file = root / name.format(step=step)
        if file.exists():
            digest.update(name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def resolve(path: str, step: int | None = None) -> tuple[str, str, int | None]:
    """(kind 'train' | 'params' | 'export', the directory holding the gin config, step) for `path`
    (local or gs://). A step, parameter checkpoint or export must be complete."""
    path = paths.as_path(path)
    if not path.is_dir():
        raise MissingFileError(f"{path} does not exist (expected a MODEL_DIR or a checkpoint directory)")
    kind = run_folders.kind(path)
    if kind == "step":  # MODEL_DIR/checkpoints/N
        if step is not None and step != int(path.name):
            raise BadValueError(f"{path} is the checkpoint of step {path.name}, not step {step}")
        if not run_folders.is_complete_step(path):
            raise MissingFileError(
                f"{path} is an incomplete checkpoint: it has no {run_folders.COMMIT_MARKER}, which the save writes "
                "last (a save that was cut off, or a copy taken while it ran); use an earlier step, or copy the "
                "step again once its save finished"
            )
        return "train", str(path.parent.parent), int(path.name)
    if kind == "run":
        steps = run_folders.complete_steps(path)
        if not steps:
            raise MissingFileError(f"no checkpoint in {run_folders.checkpoints(path)}: train first (samtone train)")
        if step is not None and step not in steps:
            raise MissingFileError(
                f"no checkpoint for step {step} in {run_folders.checkpoints(path)}; available: {steps}"
            )
        return "train", str(path), steps[-1] if step is None else step
    if kind == "params":
        require_complete(path, "parameter checkpoint")
        return "params", str(path), None
    if kind == "export":
        require_complete(path, "export")
        return "export", str(path), None
    raise MissingFileError(
        f"{path} is not a samtone checkpoint: expected a MODEL_DIR (checkpoints/), a step directory "
        "(checkpoints/<step>/state), a parameter checkpoint (params/ + model.gin) or a `samtone export` folder"
    )


def settings(path: str) -> dict:
    """The saved gin settings of the model at `path` ({'train.doc_length': 48, ...}, gin_config.read_bindings
    of a run's config.gin or a parameter checkpoint's / export's model.gin); an export's samtone.json
    lengths are its serving lengths. {} when `path` holds none."""
    import json

    from samtone_jax.config import gin_config

    kind, directory, _ = resolve(path)
    root = paths.as_path(directory)
    text_file = root / (run_folders.CONFIG_GIN if kind == "train" else run_folders.MODEL_GIN)
    found = gin_config.read_bindings(text_file.read_text()) if text_file.exists() else {}
    if kind == "export":
        info = json.loads((root / run_folders.EXPORT_JSON).read_text())
        found |= {"serving.query_length": info["query_length"], "serving.doc_length": info["doc_length"]}
    return found
