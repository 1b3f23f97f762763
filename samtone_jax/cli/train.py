"""`samtone train`: train a dual encoder. Gin files configure everything (models/ -> architectures/
-> losses/ -> runs/); the plain flags below set the settings a run changes most, each over what a gin
file set, and `--gin.NAME=VALUE` sets any other."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime

NAME = "train"
HELP = "train a dual encoder (gin: runs/*.gin; the common settings as plain flags)"
EXAMPLE = (
    "samtone train --gin_file=runs/minilm/model.gin --gin_file=runs/finetune_minilm.gin "
    "--checkpoint=runs/minilm --task=wordnet_definitions --out=runs/my_model"
)
PARSES_GIN = False  # run parses the gin files with the flags' bindings last

FLAGS = (
    flags.GinFlag("--task", "train.task", "the task (or mixture) to train on, see `samtone tasks`"),
    flags.GinFlag("--checkpoint", "train.init_checkpoint", "the model to start from: an import, a run or an export"),
    flags.GinFlag("--out", "train.model_dir", "the run's folder, MODEL_DIR (resumed when it holds this run)"),
    flags.GinFlag("--steps", "train.train_steps", "training steps", int),
    flags.GinFlag("--batch_size", "train.batch_size", "pairs a step, over all devices", int),
    flags.GinFlag("--query_length", "train.query_length", "query tokens kept", int),
    flags.GinFlag("--doc_length", "train.doc_length", "document tokens kept", int),
    flags.GinFlag("--learning_rate", "optimizer.learning_rate", "peak learning rate of the optimizer", float),
    flags.GinFlag("--vocabulary", "train.vocabulary", "SentencePiece .model or tokenizer.json"),
    flags.GinFlag("--data_dir", "data_dir.path", "data root (default: $SAMTONE_DATA_DIR)"),
    flags.GinFlag("--seed", "train.seed", "seed of the initialisation, dropout and data order", int),
    flags.GinFlag("--packing", "packing.enabled", "pack several texts a row (the same pairs, less padding)", "switch"),
    flags.GinFlag(
        "--guard",
        "guard.tasks",
        "tasks the run does not train on, scored at the start, at each eval and at the end: what the model "
        "keeps elsewhere (retention = score / the starting model's)",
        "strings",
    ),
)


def loss_file(name: str | None) -> list[str]:
    """--loss: a gin file, or the name of one in gin_configs/losses/ ('samtone' -> losses/samtone.gin)."""
    if not name:
        return []
    return [name if name.endswith(".gin") else f"losses/{name}.gin"]


def add_flags(p: argparse.ArgumentParser) -> None:
    flags.gin_flags(p)
    flags.distributed_flags(p)
    flags.add_table(p, FLAGS)
    p.add_argument(
        "--loss", default=None, help="a loss gin file, or its name in gin_configs/losses/ (e.g. samtone, in_batch)"
    )


def run(args, bindings) -> int:
    runtime.init_distributed(args)
    from samtone_jax.cli import gin_registry

    gin_files = args.gin_file + loss_file(args.loss)
    gin_registry.parse(gin_files, args.gin_bindings + bindings + flags.table_bindings(args, FLAGS))
    runtime.report_final(gin_registry.train_program())
    return 0
