"""The gin registry of the programs, and the `parse` they configure themselves with.

A gin config may name any configurable of the project (`train.*`, `train_adore.*`, `evaluate.*`,
`RetrievalEval.*`, `create_mesh.*`, `data_dir`, `adafactor.*`, the model and loss), and a typo in
any of those names must fail at parse time. So every module that defines a `@gin.configurable` is
imported here, once, at the top. Only the programs import this module (cli.py, demo.py, and the
benchmarks and tests that parse configs like the command line does); nothing below them does, so
the package's import graph has no circle (tests/test_import_graph.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import samtone_jax.evaluation.run  # noqa: F401  evaluate
import samtone_jax.evaluation.train_hook  # noqa: F401  RetrievalEval
import samtone_jax.hard_negatives.adore_train  # noqa: F401  train_adore
import samtone_jax.partitioning  # noqa: F401  create_mesh
import samtone_jax.tasks  # noqa: F401  data_dir, wordnet_dir, skip_bad_records
import samtone_jax.train  # noqa: F401  train, adafactor
from samtone_jax import gin_utils


def parse(gin_files: Sequence[str] = (), bindings: Sequence[str] = (), *, finalize: bool = True) -> None:
    """gin_utils.parse with every configurable of the project registered (see the module docstring)."""
    gin_utils.parse(gin_files, bindings, finalize=finalize)
