"""`samtone data-stats`: examples, unique queries / documents, truncation of a task."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime

NAME = "data-stats"
HELP = "examples, unique queries / documents, truncation of a task"
EXAMPLE = "samtone data-stats --task=wordnet_definitions --split=train --vocabulary=/tmp/wn.model"
PARSES_GIN = True  # runtime.with_gin parses --gin_file / --gin.NAME=VALUE before run


def add_flags(p: argparse.ArgumentParser) -> None:
    flags.task_flags(p)
    p.add_argument("--vocabulary", default=None, help="SentencePiece model for the truncation rate (default: none)")
    p.add_argument("--vocab", dest="vocabulary", action=flags.Deprecated, new="--vocabulary")
    p.add_argument("--query_length", type=int, default=64, help="query length for the truncation rate")
    p.add_argument("--doc_length", type=int, default=128, help="document length for the truncation rate")
    flags.gin_flags(p)


def run(args, bindings) -> int:
    import json

    from samtone_jax.data.stats import collection_stats

    split, collection = runtime.load_task(args)
    stats = collection_stats(collection, args.vocabulary, args.query_length, args.doc_length)
    print(json.dumps({"task": args.task, "split": split, **stats}, indent=2))
    return 0
