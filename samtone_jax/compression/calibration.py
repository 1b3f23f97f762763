"""A model's calibration for compressed serving, shipped with it: MODEL_DIR/calibration.json (also
in a parameter checkpoint and in every export), written by `samtone calibrate` from a sample of
documents the model embeds.

    {"format": "samtone_jax calibration 1",
     "dimension": 384,                              # the model's embedding dimension
     "dims": [128, 384],                            # the dimensions it serves (Matryoshka's, or the full one)
     "precisions": ["float32", "int8", "binary"],   # what it can be served at
     "trained_precisions": ["float32"],             # what its loss was computed on
     "int8_ranges": {"384": [[min, ...], [max, ...]], "128": [...]},   # per served dimension
     "source": {"task": ..., "split": ..., "documents": 10000, "step": ...}}

An int8 range is what sentence-transformers' `quantize_embeddings(..., "int8", ranges=...)` takes:
`np.array(calibration["int8_ranges"]["384"])`, shape (2, D), after truncating to the first D
dimensions and re-normalising (quantization.truncated).
"""

from __future__ import annotations

import json

import numpy as np

from samtone_jax.compression import quantization
from samtone_jax.core import paths, run_folders
from samtone_jax.core.atomic_file import write_atomic
from samtone_jax.core.errors import BadValueError

FORMAT = "samtone_jax calibration 1"


class Calibration:
    """A model's int8 ranges per served dimension, and what it may be served at."""

    def __init__(self, record: dict, where: str = "calibration"):
        if record.get("format") != FORMAT:
            raise BadValueError(f"{where} is not a samtone_jax calibration (format {record.get('format')!r})")
        self.where, self.record = where, record
        try:
            self.dimension = int(record["dimension"])
            self.ranges = {int(d): np.asarray(r, np.float32) for d, r in record.get("int8_ranges", {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            what = f"no {e}" if isinstance(e, KeyError) else str(e)
            raise BadValueError(
                f"{where} is damaged ({what}): rewrite it with samtone calibrate (see calibration.py for its fields)"
            ) from None
        for d, r in self.ranges.items():
            quantization.check_ranges(r, d, f"{where}'s int8 ranges of dimension {d}")

    @classmethod
    def from_sample(cls, documents: np.ndarray, dims, trained_precisions=("float32",), source=None) -> Calibration:
        """Ranges of `documents` [N, D] (float32 embeddings) truncated to each of `dims`."""
        documents = np.asarray(documents, np.float32)
        dimension = documents.shape[1]
        dims = sorted(set(int(d) for d in (dims or (dimension,))))
        if dims[0] < 1 or dims[-1] > dimension:
            raise BadValueError(f"calibration dims {tuple(dims)} must lie in [1, {dimension}]")
        ranges = {str(d): quantization.int8_ranges(quantization.truncated(documents, d)).tolist() for d in dims}
        record = {
            "format": FORMAT,
            "dimension": dimension,
            "dims": dims,
            "precisions": list(quantization.PRECISIONS),
            "trained_precisions": list(trained_precisions),
            "int8_ranges": ranges,
            "source": dict(source or {}, documents=len(documents)),
        }
        return cls(record)

    def int8_ranges(self, dim: int | None = None) -> np.ndarray:
        """[2, dim] ranges of the embeddings truncated to `dim` (None: the full dimension)."""
        dim = self.dimension if dim is None else dim
        if dim not in self.ranges:
            raise BadValueError(
                f"{self.where} has int8 ranges for dimensions {sorted(self.ranges)}, not {dim}: serve one of "
                f"those, or recalibrate with it (samtone calibrate --dims {dim})"
            )
        return self.ranges[dim]

    def compress(self, embeddings: np.ndarray, precision: str, dim: int | None = None) -> np.ndarray:
        """float32 [N, D] embeddings -> the codes served at (`precision`, `dim`): float32 truncated,
        int8 codes with this calibration's ranges, or packed sign bits."""
        quantization.check_precision(precision)
        if embeddings.shape[-1] != self.dimension:
            raise BadValueError(
                f"embeddings of dimension {embeddings.shape[-1]} do not match {self.where} ({self.dimension})"
            )
        x = embeddings if dim is None else quantization.truncated(embeddings, dim)
        return quantization.encode(x, precision, self.int8_ranges(dim) if precision == "int8" else None)

    def save(self, folder) -> str:
        return write_atomic(
            paths.as_path(folder) / run_folders.CALIBRATION, json.dumps(self.record, indent=1, sort_keys=True)
        )


def load(folder) -> Calibration | None:
    """The calibration shipped in `folder` (a run, parameter checkpoint or export), or None."""
    path = paths.as_path(folder) / run_folders.CALIBRATION
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except ValueError as e:
        raise BadValueError(f"{path} is not valid JSON ({e}): rewrite it with samtone calibrate") from e
    return Calibration(record, str(path))
