"""Parameter checkpoints on disk: an orbax PyTree plus the model's gin config, written atomically.

Layout of a parameter checkpoint directory (what `import-checkpoint` writes and what a run's
`INIT_CHECKPOINT` reads):

  DIR/params/     orbax StandardCheckpointer tree {encoder: ..., projection: ...}
  DIR/model.gin   the gin bindings that rebuild the DualEncoder (T5Config.*, DualEncoder.*)
  DIR/info.json   where it came from (format, source path, unused source variables)

Everything is written under a temporary sibling and renamed into place, so a killed job leaves
either the complete directory or nothing (a stale `DIR.tmp-*` at most).
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp

from samtone_jax.atomic_file import atomic_directory

PARAMS_SUBDIR = "params"
MODEL_GIN = "model.gin"
INFO_JSON = "info.json"


def save_params(directory: str, params, model_gin: str, info: dict | None = None, overwrite: bool = False,
                extra_files: dict[str, bytes] | None = None) -> str:  # fmt: skip
    """Write `params` (a pytree of arrays), `model_gin`, `info` and `extra_files` ({name: bytes},
    e.g. the vocabulary) to `directory` atomically."""
    directory = os.path.abspath(directory)
    with atomic_directory(directory, overwrite) as tmp:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(os.path.join(tmp, PARAMS_SUBDIR), jax.tree_util.tree_map(np.asarray, params))
        checkpointer.wait_until_finished()
        with open(os.path.join(tmp, MODEL_GIN), "w") as f:
            f.write(model_gin)
        with open(os.path.join(tmp, INFO_JSON), "w") as f:
            json.dump(info or {}, f, indent=2, sort_keys=True)
        for name, data in (extra_files or {}).items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
    return directory


def load_params(directory: str, abstract_params=None):
    """Restore the parameter tree saved by `save_params` (numpy arrays unless `abstract_params`
    carries shardings, as `jax.ShapeDtypeStruct`s, to restore onto devices directly)."""
    path = os.path.join(os.path.abspath(directory), PARAMS_SUBDIR)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"{path} not found: {directory} is not a parameter checkpoint (expected the output of "
            "`samtone import-checkpoint` or a saved run's params)"
        )
    return ocp.StandardCheckpointer().restore(path, abstract_params)


def load_model_gin(directory: str) -> str:
    path = os.path.join(directory, MODEL_GIN)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: the checkpoint has no model gin config")
    with open(path) as f:
        return f.read()
