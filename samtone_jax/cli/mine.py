"""`samtone mine`: hard negatives for a task's queries, from a trained model or BM25."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime
from samtone_jax.core.errors import BadValueError, ExistingFileError

NAME = "mine"
HELP = "hard negatives for a task's queries, from a trained model or BM25"
EXAMPLE = "samtone mine --bm25 --task=multireqa_squad_dev --out=/tmp/negatives.tsv --num_negatives=8"
PARSES_GIN = True  # runtime.with_gin parses --gin_file / --gin.NAME=VALUE before run


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None, help="dense mining with this model (MODEL_DIR or checkpoint)")
    p.add_argument("--bm25", action="store_true", help="BM25 mining (bm25s) instead of a model")
    p.add_argument("--step", type=int, default=None, help="checkpoint step of --checkpoint (default: the latest)")
    p.add_argument("--vocabulary", default=None, help="vocabulary of --checkpoint (default: the run's)")
    flags.task_flags(p)
    p.add_argument("--out", required=True, help="output TSV 'query_id<TAB>doc_id,doc_id,...' (+ OUT.json counts)")
    p.add_argument("--num_negatives", type=int, default=8, help="negatives kept a query")
    p.add_argument("--range_min", type=int, default=0, help="first retrieved rank kept (0-based)")
    p.add_argument("--range_max", type=int, default=100, help="retrieval depth; ranks >= this are ignored")
    flags.false_negative_flags(p)
    p.add_argument(
        "--strategy", choices=["top", "sample"], default="top", help="the best-ranked candidates, or a random sample"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --strategy=sample")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    flags.gin_flags(p)


def run(args, bindings) -> int:
    from samtone_jax.core import paths
    from samtone_jax.data.false_negatives import FalseNegativeFilter
    from samtone_jax.hard_negatives.mining import mine

    paths.check_bucket(args.out, "--out")
    if bool(args.checkpoint) == args.bm25:
        raise BadValueError("samtone mine needs exactly one of --checkpoint=MODEL (dense mining) or --bm25")
    for out in (args.out, args.out + ".json"):
        inputs = runtime.model_inputs("--checkpoint", args.checkpoint) + runtime.task_inputs(args.task)
        paths.check_not_input(out, inputs, refuse=paths.NEW_FILES)
    if paths.as_path(args.out).exists() and not args.overwrite:  # before the slow part, as export does
        raise ExistingFileError(f"{paths.as_str(args.out)} already exists; choose another --out or pass --overwrite")
    split, collection = runtime.load_task(args)
    encoder, mesh = None, None
    if args.checkpoint:
        import jax

        from samtone_jax.inference import encoder as inference
        from samtone_jax.models import partitioning

        mesh = partitioning.create_mesh(devices=jax.local_devices())
        encoder = inference.load_encoder(
            args.checkpoint, step=args.step, vocabulary=args.vocabulary, mesh=mesh, task=args.task
        )
    summary = mine(
        collection,
        args.out,
        encoder=encoder,
        num_negatives=args.num_negatives,
        range_min=args.range_min,
        range_max=args.range_max,
        false_negatives=FalseNegativeFilter(args.margin, args.relative_margin, args.max_score),
        strategy=args.strategy,
        seed=args.seed,
        mesh=mesh,
    )
    print(
        f"{summary['queries']:,} queries of {args.task}/{split} -> {args.out}: {summary['with_enough_negatives']:,} "
        f"with {args.num_negatives} negatives, {summary['without_enough_negatives']:,} with fewer "
        f"({summary['without_any_negative']:,} with none), {summary['dropped_as_false_negatives']:,} candidates "
        f"dropped as likely false negatives; counts in {args.out}.json"
    )
    return 0
