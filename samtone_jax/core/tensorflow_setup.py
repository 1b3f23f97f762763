"""TensorFlow for input pipelines only: `from samtone_jax.core.tensorflow_setup import tf`.

TensorFlow runs seqio's tf.data pipelines and reads Mesh-TF checkpoints; JAX owns the
accelerators. On import this module hides every GPU from TensorFlow (T5X does the same), so
tf.data never reserves accelerator memory that JAX needs. Hiding them is also where TensorFlow
first probes CUDA: on a host without a GPU driver that probe logs `failed call to cuInit: ...
UNKNOWN ERROR (303)` at ERROR level, which reads like a failure to a newcomer and is not one.
That probe runs here with the process's stderr captured; every line it writes except the known
CUDA-driver-absent lines is passed on unchanged, so a real TensorFlow error still shows.
Import this before any TensorFlow op runs (every module of the package that uses TF or seqio does).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

import tensorflow as tf

# What TensorFlow's CUDA probe logs when the host has no GPU driver (harmless on a CPU or TPU host).
NO_DRIVER_LINE = re.compile(
    r"failed call to cuInit|Could not find cuda drivers|cuda_diagnostics|kernel driver does not"
)


def _hide_gpus_quietly() -> None:
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no usable stderr (a daemon): nothing to keep clean
        tf.config.set_visible_devices([], "GPU")
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # devices already initialised (an op ran before this import): keep them
            pass
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode(errors="replace")
    kept = "".join(line for line in text.splitlines(True) if not NO_DRIVER_LINE.search(line))
    if kept:
        sys.stderr.write(kept)
        sys.stderr.flush()


_hide_gpus_quietly()

__all__ = ["tf"]
