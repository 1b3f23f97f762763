"""`samtone calibrate`: the int8 ranges a model is served with, from a sample of a task's documents."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime

NAME = "calibrate"
HELP = "the int8 ranges a model is served with, from a sample of a task's documents"
EXAMPLE = "samtone calibrate --checkpoint=runs/my_model --task=wordnet_definitions --documents=10000"
PARSES_GIN = True  # runtime.with_gin parses --gin_file / --gin.NAME=VALUE before run


def add_flags(p: argparse.ArgumentParser) -> None:
    flags.checkpoint_flags(p)
    flags.task_flags(p)
    p.add_argument("--documents", type=int, default=10000, help="an even sample of this many documents (by id)")
    flags.weights_flag(p)
    p.add_argument(
        "--dims", nargs="+", default=None, help="dimensions to calibrate (default: the Matryoshka ones and the full)"
    )
    flags.gin_flags(p)


def run(args, bindings) -> int:
    from samtone_jax.checkpoints import reader
    from samtone_jax.evaluation.calibrate import calibrate
    from samtone_jax.inference import encoder as inference

    split, collection = runtime.load_task(args)
    kind, directory, _ = reader.resolve(args.checkpoint, args.step)
    encoder = inference.load_encoder(
        args.checkpoint,
        step=args.step,
        vocabulary=args.vocabulary,
        doc_length=args.doc_length,
        task=args.task,
        calibrated=False,  # the one being replaced may be stale or damaged
        weights=args.weights,
    )
    dims = tuple(int(k) for k in flags.items(args.dims)) if args.dims else None
    source = {"task": args.task, "split": split}
    path = calibrate(encoder, directory, collection.corpus, args.documents, dims, source)
    print(f"int8 ranges of {args.task}/{split} documents (step {encoder.step}) -> {path}")
    return 0
