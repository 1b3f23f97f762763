"""`samtone train-adore`: ADORE, the query tower trained against a frozen document index (gin
train_adore.*, runs/adore.gin)."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime

NAME = "train-adore"
HELP = "ADORE: train the query tower against a frozen index (gin: train_adore.*)"
EXAMPLE = (
    "samtone train-adore --gin_file=runs/adore.gin --gin.INIT=\"'runs/my_model'\" "
    "--gin.MODEL_DIR=\"'runs/adore'\" --gin.TASK=\"'multireqa_squad_dev'\""
)
PARSES_GIN = False


def add_flags(p: argparse.ArgumentParser) -> None:
    flags.gin_flags(p)
    flags.distributed_flags(p)


def run(args, bindings) -> int:
    runtime.init_distributed(args)
    from samtone_jax.cli import gin_registry

    gin_registry.parse(args.gin_file, args.gin_bindings + bindings)
    runtime.report_final(gin_registry.train_adore_program())
    return 0
