"""Parameter checkpoints on disk: an orbax PyTree plus the model's gin config, written atomically.

Layout of a parameter checkpoint directory (what `import-checkpoint` writes and what a run's
`INIT_CHECKPOINT` reads):

  DIR/params/     orbax StandardCheckpointer tree {encoder: ..., projection: ...}
  DIR/model.gin   the gin bindings that rebuild the DualEncoder (T5Config.*, DualEncoder.*)
  DIR/info.json   where it came from (format, source path, unused source variables)

Everything is written through `atomic_directory` (local or gs://): a killed job leaves either the
complete directory, with its commit marker, or nothing a reader accepts.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import orbax.checkpoint as ocp

from samtone_jax.core import paths
from samtone_jax.core.atomic_file import atomic_directory, require_complete
from samtone_jax.core.errors import ExistingFileError, MissingFileError
from samtone_jax.core.run_folders import INFO_JSON, MODEL_GIN, PARAMS


def save_params(
    directory: str,
    params,
    model_gin: str,
    info: dict | None = None,
    overwrite: bool = False,
    extra_files: dict[str, bytes] | None = None,
) -> str:
    """Write `params` (a pytree of arrays), `model_gin`, `info` and `extra_files` ({name: bytes},
    e.g. the vocabulary) to `directory` atomically."""
    directory = paths.as_path(directory)
    with atomic_directory(directory, overwrite) as tmp:
        staging = paths.as_path(tmp)  # local
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(staging / PARAMS, jax.tree_util.tree_map(np.asarray, params))
        checkpointer.wait_until_finished()
        (staging / MODEL_GIN).write_text(model_gin)
        (staging / INFO_JSON).write_text(json.dumps(info or {}, indent=2, sort_keys=True))
        for name, data in (extra_files or {}).items():
            (staging / name).write_bytes(data)
    return str(directory)


def save_sharded_params(
    directory: str,
    params,
    model_gin: str,
    info: dict | None = None,
    overwrite: bool = False,
    extra_files: dict[str, bytes] | None = None,
) -> str:
    """save_params for parameters sharded over the devices of one or several processes (a pod): every
    process writes its own shards with orbax into `<directory>.staged` beside it (gs://, or a disk
    the processes share), then process 0 writes the small files and commits it as atomic_directory
    does (marker last; an overwrite replaces only what was there at the start; a kill leaves the
    old version, or on gs:// a complete new one the next write moves in)."""
    from jax.experimental import multihost_utils

    from samtone_jax.core.atomic_file import begin_in_place, commit_in_place, write_atomic

    error, staged, seen = None, None, None
    if jax.process_index() == 0:
        try:
            staged, seen = begin_in_place(directory, overwrite)
        except Exception as e:  # noqa: BLE001  told to every process below, then raised
            error = e
    ok = multihost_utils.broadcast_one_to_all(np.int32(error is None))
    if error is not None:
        raise error
    if not int(ok):
        raise ExistingFileError(f"{directory}: process 0 could not start the write (its log says why)")
    staged = paths.as_path(f"{paths.as_str(directory)}.staged")  # every process: the same folder
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(staged / PARAMS, params)
    checkpointer.wait_until_finished()
    multihost_utils.sync_global_devices("save_sharded_params: shards written")
    if jax.process_index() == 0:
        write_atomic(staged / MODEL_GIN, model_gin)
        write_atomic(staged / INFO_JSON, json.dumps(info or {}, indent=2, sort_keys=True))
        for name, data in (extra_files or {}).items():
            write_atomic(staged / name, data)
        commit_in_place(directory, seen)
    multihost_utils.sync_global_devices("save_sharded_params: committed")
    return str(directory)


def load_params(directory: str, abstract_params=None):
    """Restore the parameter tree saved by `save_params` (numpy arrays unless `abstract_params`
    carries shardings, as `jax.ShapeDtypeStruct`s, to restore onto devices directly)."""
    path = paths.as_path(directory) / PARAMS
    if not path.is_dir():
        raise MissingFileError(
            f"{path} not found: {directory} is not a parameter checkpoint (expected the output of "
            "`samtone import-checkpoint` or a saved run's params)"
        )
    require_complete(directory, "parameter checkpoint")
    if abstract_params is not None:  # (those keys only: a LoRA run reads the tower of an import)
        return restore_part(path, abstract_params)
    # numpy whatever layout wrote it (a sharded soup's arrays would otherwise come back in its sharding)
    metadata = ocp.StandardCheckpointer().metadata(path)
    tree = getattr(metadata, "item_metadata", metadata)
    tree = getattr(tree, "tree", tree)
    restore_args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))


def restore_part(path, target):
    """The part of a saved tree that `target` names (nested dicts of jax.ShapeDtypeStructs with
    shardings, a subset of the saved keys), restored onto those shardings; nothing else is read."""
    restore_args = jax.tree_util.tree_map(lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding), target)
    return ocp.PyTreeCheckpointer().restore(
        paths.as_path(path), args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)
    )


def load_model_gin(directory) -> str:
    path = paths.as_path(directory) / MODEL_GIN
    if not path.exists():
        raise MissingFileError(f"{path} not found: the checkpoint has no model gin config")
    return path.read_text()
