"""The gin registry of the programs, and the `parse` they configure themselves with.

A gin config may name any configurable of the project (`train.*`, `train_adore.*`, `evaluate.*`,
`RetrievalEval.*`, `create_mesh.*`, `data_dir`, `adafactor.*`, the model and loss), and a typo in
any of those names must fail at parse time. So every module that defines a `@gin.configurable` is
imported here, once, at the top. Only the programs import this module (cli.py, demo.py, and the
benchmarks and tests that parse configs like the command line does); nothing below them does, so
the package's import graph has no circle (tests/test_import_graph.py).

It is also the edge where the programs get their dependencies: `train_program` builds the model,
loss, mesh and partitioning rules from gin and passes them to train.train (T5X's style: the
training function's signature says what it depends on).
"""

from __future__ import annotations

from collections.abc import Sequence

import samtone_jax.data.false_negatives  # noqa: F401  FalseNegativeFilter
import samtone_jax.evaluation.run  # noqa: F401  evaluate
import samtone_jax.evaluation.train_hook  # noqa: F401  RetrievalEval
import samtone_jax.inference.serving_lengths  # noqa: F401  serving.query_length / serving.doc_length
import samtone_jax.tasks.catalogue  # noqa: F401  data_dir, wordnet_dir, skip_bad_records, mixtures
import samtone_jax.tasks.declared  # noqa: F401  tfds_tasks, local_tasks
import samtone_jax.tasks.prompts  # noqa: F401  prompts
from samtone_jax.config import gin_config
from samtone_jax.evaluation.guard import GuardSettings
from samtone_jax.hard_negatives import adore_train
from samtone_jax.models import partitioning
from samtone_jax.training import train


def parse(gin_files: Sequence[str] = (), bindings: Sequence[str] = (), *, finalize: bool = True) -> None:
    """gin_config.parse with every configurable of the project registered (see the module docstring)."""
    gin_config.parse(gin_files, bindings, finalize=finalize)


def train_program() -> dict:
    """`samtone train`: train.train with its dependencies built from gin here, at the edge: the
    model (T5Config.* / DualEncoder.*), the loss (contrastive_loss.*, distillation_loss.*), the mesh
    (create_mesh.*), the partitioning rules (logical_rules.fsdp) and the guard (guard.*)."""
    return train.train(
        model=gin_config.model(),
        loss_fn=gin_config.contrastive_loss,
        mesh=partitioning.create_mesh(),
        rules=partitioning.logical_rules(),
        distill_fn=gin_config.distillation_loss,
        guard=GuardSettings(),
    )


def train_adore_program() -> dict:
    """`samtone train-adore`: adore_train.train_adore on the gin-configured mesh."""
    return adore_train.train_adore(mesh=partitioning.create_mesh())
