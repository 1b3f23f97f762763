"""`samtone calibrate`: the int8 ranges a model is served with, from an even sample of a task's
documents embedded by the model itself, written beside its weights (calibration.py) so that load,
eval, encode and export use them.

    samtone calibrate --checkpoint=runs/my_model --task=wordnet_definitions --documents=10000
"""

from __future__ import annotations

import numpy as np

from samtone_jax.compression import calibration
from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError


def calibrate(encoder, folder: str, documents: dict[str, str], size: int, dims=None, source=None) -> str:
    """Embed an even sample (by id) of `size` of `documents` with `encoder` and write the folder's
    calibration.json for `dims` (default: the model's Matryoshka dimensions and the full one)."""
    if size < 2:
        raise BadValueError(f"--documents must be at least 2 (a range needs a spread), got {size}")
    ids = sorted(documents)
    if len(ids) < 2:
        raise BadValueError(f"the task has {len(ids)} documents: a calibration needs at least 2")
    chosen = [ids[i] for i in np.linspace(0, len(ids) - 1, min(size, len(ids))).astype(int)]
    embeddings = encoder.encode_documents([documents[i] for i in chosen])
    dimension = embeddings.shape[1]
    dims = sorted(set(dims or (*(encoder.matryoshka_dims or ()), dimension)))
    if dims[0] < 1 or dims[-1] > dimension:
        raise BadValueError(f"--dims must lie in [1, {dimension}] (the model's embedding dimension); got {dims}")
    found = calibration.Calibration.from_sample(
        embeddings,
        dims,
        trained_precisions=_trained_precisions(folder),
        source=dict(source or {}, step=encoder.step, weights=encoder.weights, model=paths.as_str(folder)),
    )
    return found.save(folder)


def _trained_precisions(folder: str) -> tuple[str, ...]:
    """The precisions a run's loss was computed at (objective.quantized_precisions; float32 otherwise)."""
    from samtone_jax.config import gin_config
    from samtone_jax.core import run_folders

    root = paths.as_path(folder)
    config = next((root / n for n in (run_folders.CONFIG_GIN, run_folders.MODEL_GIN) if (root / n).exists()), None)
    settings = gin_config.read_bindings(config.read_text()) if config is not None else {}  # a run's, a soup's
    return tuple(settings.get("objective.quantized_precisions") or ("float32",))
