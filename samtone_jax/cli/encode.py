"""`samtone encode`: embed a task's queries / corpus into resumable shards."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime

NAME = "encode"
HELP = "embed a task's queries / corpus into resumable shards"
EXAMPLE = "samtone encode --checkpoint=runs/my_model --task=wordnet_definitions --split=test --side=document"
PARSES_GIN = True  # runtime.with_gin parses --gin_file / --gin.NAME=VALUE before run


def add_flags(p: argparse.ArgumentParser) -> None:
    flags.checkpoint_flags(p)
    flags.task_flags(p)
    flags.distributed_flags(p)
    p.add_argument("--side", choices=["query", "document", "both"], default="both", help="which texts to embed")
    p.add_argument("--out", default=None, help="output folder (default: <MODEL_DIR>/embeddings/<task>_<split>_step<N>)")
    p.add_argument("--shard_size", type=int, default=65536, help="rows per shard file (the unit of resumption)")
    p.add_argument(
        "--precisions",
        dest="precision",
        choices=["float32", "int8", "binary"],
        default="float32",
        help="store as an index serves them: int8 codes (the model's calibration.json) or packed sign bits "
        "(one precision: the shards hold one index)",
    )
    p.add_argument("--precision", dest="precision", action=flags.Deprecated, new="--precisions")
    p.add_argument(
        "--dims", dest="dim", type=int, default=None, help="the first k dimensions, re-normalised (one k; Matryoshka)"
    )
    p.add_argument("--dim", dest="dim", type=int, action=flags.Deprecated, new="--dims")
    p.add_argument("--batch_size", type=int, default=256, help="texts (packed: rows) a batch (rounded to the devices)")
    p.add_argument(
        "--packing_max_segments", type=int, default=None, help="pack texts up to this many a row (same embeddings)"
    )
    flags.gin_flags(p)


def run(args, bindings) -> int:
    runtime.init_distributed(args)
    import jax

    from samtone_jax.core import paths
    from samtone_jax.evaluation.run import embed
    from samtone_jax.inference import encoder as inference
    from samtone_jax.models import partitioning

    split, collection = runtime.load_task(args)
    out = args.out or default_embeddings_dir(args.checkpoint, args.task, split, args.step)
    paths.check_bucket(out, "--out")
    # (embeddings are kept inside their model's folder by default: inside it is fine)
    paths.check_not_input(
        out,
        runtime.model_inputs("--checkpoint", args.checkpoint) + runtime.task_inputs(args.task),
        refuse=paths.NEW_FILES,
    )
    encoder = inference.load_encoder(
        args.checkpoint,
        step=args.step,
        vocabulary=args.vocabulary,
        query_length=args.query_length,
        doc_length=args.doc_length,
        batch_size=args.batch_size,
        mesh=partitioning.create_mesh(devices=jax.local_devices()),
        packing_max_segments=args.packing_max_segments,
        task=args.task,
    )
    if args.precision != "float32" or args.dim is not None:  # before any shard: one short text says it
        encoder.encode_documents(["a"], precision=args.precision, dim=args.dim)
    sides = {"query": ("query",), "document": ("document",), "both": ("query", "document")}[args.side]
    for side in sides:
        texts = collection.queries if side == "query" else collection.corpus
        folder = paths.join(out, "queries" if side == "query" else "documents")
        stale = "recompute" if args.out is None else "refuse"  # our cache is redone; a folder you named is kept
        ids, embeddings = embed(encoder, texts, side, folder, args.shard_size, args.precision, args.dim, stale)
        if jax.process_index() == 0:
            what = f"{embeddings.dtype} {list(embeddings.shape[1:])}"
            print(f"{len(ids):,} {side} embeddings ({what}) of {args.task}/{split} -> {folder}")
    return 0


def default_embeddings_dir(checkpoint: str, task: str, split: str, step: int | None) -> str:
    from samtone_jax.checkpoints import reader
    from samtone_jax.core import paths

    kind, directory, step = reader.resolve(checkpoint, step)
    return paths.join(directory, "embeddings", f"{task}_{split}" + (f"_step{step}" if step is not None else ""))
