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

from samtone_jax import paths
from samtone_jax.atomic_file import atomic_directory, require_complete
from samtone_jax.errors import MissingFileError
from samtone_jax.run_folders import INFO_JSON, MODEL_GIN, PARAMS


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
    return ocp.StandardCheckpointer().restore(path, abstract_params)


def load_model_gin(directory) -> str:
    path = paths.as_path(directory) / MODEL_GIN
    if not path.exists():
        raise MissingFileError(f"{path} not found: the checkpoint has no model gin config")
    return path.read_text()
