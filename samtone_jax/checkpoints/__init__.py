"""Checkpoints in: importers for Hugging Face, T5X and Mesh-TF T5; parameter checkpoints on disk."""

from samtone_jax.checkpoints.importer import FORMATS, abstract_params, import_params
from samtone_jax.checkpoints.params_io import load_model_gin, load_params, save_params
from samtone_jax.checkpoints.source import CheckpointMismatchError

__all__ = [
    "FORMATS",
    "CheckpointMismatchError",
    "abstract_params",
    "import_params",
    "load_model_gin",
    "load_params",
    "save_params",
]
