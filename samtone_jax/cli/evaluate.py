"""`samtone eval`: retrieval metrics of a trained model on a task's split (gin evaluate.*; every
setting also a plain flag, which wins over a gin file)."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime

NAME = "eval"
HELP = "retrieval metrics of a trained model (gin: evaluate.*)"
EXAMPLE = "samtone eval --checkpoint=runs/my_model --task=wordnet_definitions --max_queries=2000 --candidates=20000"
PARSES_GIN = False

FLAGS = (
    flags.GinFlag("--checkpoint", "evaluate.model_dir", "the model: a run, one of its steps, an import or an export"),
    flags.GinFlag("--task", "evaluate.task", "the task to evaluate on, see `samtone tasks`"),
    flags.GinFlag("--split", "evaluate.split", "its split (default: test, or dev if it has no test)"),
    flags.GinFlag("--data_dir", "data_dir.path", "data root (default: $SAMTONE_DATA_DIR)"),
    flags.GinFlag("--step", "evaluate.step", "checkpoint step (default: the latest)", int),
    flags.GinFlag("--vocabulary", "evaluate.vocabulary", "vocabulary file (default: the run's)"),
    flags.GinFlag("--query_length", "evaluate.query_length", "default: the run's train.query_length", int),
    flags.GinFlag("--doc_length", "evaluate.doc_length", "default: the run's train.doc_length", int),
    flags.GinFlag("--max_queries", "evaluate.max_queries", "an even sample of this many queries (default: all)", int),
    flags.GinFlag(
        "--candidates", "evaluate.candidates", "rank among this many documents, the gold ones kept (default: all)", int
    ),
    flags.GinFlag("--skip_bad_records", "skip_bad_records.enabled", "skip and count malformed lines", "switch"),
    flags.GinFlag(
        "--dims",
        "evaluate.dims",
        "also the metrics of the first k dimensions of every embedding, re-normalised, for each k of e.g. "
        "64,128,256 or 64 128 256 (a Matryoshka model's smaller indexes)",
        "integers",
    ),
    flags.GinFlag(
        "--precisions",
        "evaluate.precisions",
        "also search the index compressed as served: float32, int8 (per-dimension ranges from a sample of the "
        "corpus), binary (sign bits, Hamming), e.g. float32,int8,binary",
        "strings",
    ),
    flags.GinFlag(
        "--rescore", "evaluate.rescore", "int8 / binary also with the top k·R re-ranked by the float query", int
    ),
    flags.GinFlag("--weights", "evaluate.weights", "a run's parameters (params) or their moving average (ema)"),
)


def add_flags(p: argparse.ArgumentParser) -> None:
    flags.gin_flags(p)
    flags.distributed_flags(p)
    flags.add_table(p, FLAGS)


def run(args, bindings) -> int:
    runtime.init_distributed(args)
    from samtone_jax.cli import gin_registry
    from samtone_jax.evaluation.run import evaluate

    gin_registry.parse(args.gin_file, args.gin_bindings + bindings + flags.table_bindings(args, FLAGS))
    evaluate()
    return 0
