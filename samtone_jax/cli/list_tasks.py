"""`samtone tasks`: every task with its splits and the files it reads, and every mixture."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags

NAME = "tasks"
HELP = "every task with its splits and the files it reads, and every mixture"
EXAMPLE = "samtone tasks --gin_file=runs/my_data.gin"
PARSES_GIN = True  # runtime.with_gin parses --gin_file / --gin.NAME=VALUE before run


def add_flags(p: argparse.ArgumentParser) -> None:
    flags.gin_flags(p)
    p.add_argument("--data_dir", default=None, help="data root shown (default: $SAMTONE_DATA_DIR)")


def run(args, bindings) -> int:
    """Every task (built-in, TFDS, your own) with its splits and the files it reads, and every mixture."""
    from samtone_jax.tasks import catalogue

    print(catalogue.describe())
    return 0
