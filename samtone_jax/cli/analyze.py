"""`samtone analyze`: the paper's embedding-space figures for one or more models."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime
from samtone_jax.core.errors import BadValueError

NAME = "analyze"
HELP = "the paper's embedding-space figures for one or more models"
EXAMPLE = (
    "samtone analyze --checkpoint=runs/minilm --checkpoint=runs/my_model --task=wordnet_definitions "
    "--split=test --out=/tmp/figures"
)
PARSES_GIN = True  # runtime.with_gin parses --gin_file / --gin.NAME=VALUE before run


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", action="append", required=True, help="model to analyse (repeat to compare)")
    p.add_argument("--name", action="append", default=None, help="display name per --checkpoint")
    p.add_argument("--vocabulary", default=None, help="SentencePiece .model or tokenizer.json (default: each run's)")
    p.add_argument("--query_length", type=int, default=None, help="default: each run's train.query_length")
    p.add_argument("--doc_length", type=int, default=None, help="default: each run's train.doc_length")
    flags.task_flags(p)
    p.add_argument("--out", required=True, help="folder for the PNGs, summary.json and report.md")
    p.add_argument("--tsne_sample", type=int, default=500, help="(query, gold document) pairs in the t-SNE")
    p.add_argument("--ratio_pairs", type=int, default=10000, help="random (i, j) pairs of the similarity ratio")
    p.add_argument("--max_queries", type=int, default=None, help="analyse the first N queries by id")
    p.add_argument("--seed", type=int, default=0, help="seed of the t-SNE sample and the random pairs")
    flags.gin_flags(p)


def run(args, bindings) -> int:
    import jax

    from samtone_jax.analysis import analyze
    from samtone_jax.core import paths
    from samtone_jax.inference import encoder as inference
    from samtone_jax.models import partitioning

    paths.check_bucket(args.out, "--out")
    inputs = [i for c in args.checkpoint for i in runtime.model_inputs("--checkpoint", c)] + runtime.task_inputs(
        args.task
    )
    paths.check_not_input(args.out, inputs, refuse=paths.NEW_FILES)
    names = args.name or [paths.as_path(c).name for c in args.checkpoint]
    if len(names) != len(args.checkpoint) or len(set(names)) != len(names):
        raise BadValueError(f"--name must give one distinct name per --checkpoint; got {names} for {args.checkpoint}")
    split, collection = runtime.load_task(args)
    mesh = partitioning.create_mesh(devices=jax.local_devices())
    encoders = {
        name: inference.load_encoder(
            path,
            vocabulary=args.vocabulary,
            query_length=args.query_length,
            doc_length=args.doc_length,
            mesh=mesh,
            task=args.task,
        )
        for name, path in zip(names, args.checkpoint, strict=True)
    }
    summary = analyze(
        encoders,
        collection.drop_empty(),
        args.out,
        tsne_sample=args.tsne_sample,
        ratio_pairs=args.ratio_pairs,
        seed=args.seed,
        max_queries=args.max_queries,
    )
    for name, numbers in summary["models"].items():
        print(
            f"{name}: median top-1 cosine {numbers['top1_cosine_median']:.4f}, "
            f"median similarity ratio {numbers['similarity_ratio_median']:.4f}"
        )
    print(f"figures and report.md in {args.out}")
    return 0
