"""`samtone score`: a teacher's scores of a task's training pairs and candidates (for distillation)."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime
from samtone_jax.core.errors import BadValueError, ExistingFileError, MissingFileError
from samtone_jax.hard_negatives.teachers import KINDS as TEACHER_KINDS

NAME = "score"
HELP = "a teacher's scores of a task's training pairs and candidates (for distillation)"
EXAMPLE = "samtone score --checkpoint=bm25 --task=multireqa_squad_dev --out=/tmp/scores.jsonl"
PARSES_GIN = True  # runtime.with_gin parses --gin_file / --gin.NAME=VALUE before run


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint",
        dest="teacher",
        default=None,
        help="the teacher: 'bm25', or a samtone run / checkpoint / export, a sentence-transformers folder or a "
        "CrossEncoder folder (required)",
    )
    p.add_argument("--teacher", dest="teacher", action=flags.Deprecated, new="--checkpoint")
    p.add_argument(
        "--teacher_kind", default="auto", choices=TEACHER_KINDS, help="what --checkpoint is (auto: from its files)"
    )
    p.add_argument("--step", type=int, default=None, help="checkpoint step of a samtone teacher (default: latest)")
    p.add_argument("--vocabulary", default=None, help="vocabulary of a samtone teacher (default: its own)")
    flags.task_flags(p)
    p.add_argument("--out", required=True, help="output JSON lines (qid, negatives, scores, positives); + OUT.json")
    p.add_argument(
        "--candidates",
        default="top",
        help="'top': the teacher's own top --depth documents; or a negatives file (samtone mine) to score",
    )
    p.add_argument("--depth", type=int, default=32, help="candidates per query with --candidates=top")
    p.add_argument("--shard_size", type=int, default=1000, help="queries per resumable shard")
    p.add_argument("--batch_size", type=int, default=64, help="texts per batch of a model teacher")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    flags.gin_flags(p)


def run(args, bindings) -> int:
    from samtone_jax.core import paths
    from samtone_jax.hard_negatives import scoring, teachers

    runtime.required(args, "teacher", "--checkpoint (the teacher: bm25 or a model)")
    paths.check_bucket(args.out, "--out")
    inputs = runtime.task_inputs(args.task) + [("--candidates", None if args.candidates == "top" else args.candidates)]
    if args.teacher != "bm25":
        inputs += runtime.model_inputs("--checkpoint", args.teacher)
    for out in (args.out, args.out + ".json"):
        paths.check_not_input(out, inputs, refuse=paths.NEW_FILES)
    if paths.as_path(args.out).exists() and not args.overwrite:
        raise ExistingFileError(f"{paths.as_str(args.out)} already exists; choose another --out or pass --overwrite")
    split, collection = runtime.load_task(args)
    candidates = args.candidates
    if candidates != "top":
        from samtone_jax.data import teacher_scores
        from samtone_jax.data.records import ReadStats

        if not paths.as_path(candidates).exists():
            raise MissingFileError(f"--candidates={candidates}: no such file (or pass --candidates=top)")
        if args.depth != 32:
            raise BadValueError("--depth is the number of top candidates of --candidates=top; a file's are all scored")
        stats = ReadStats()
        candidates, _ = teacher_scores.read(candidates, stats, args.skip_bad_records)
        stats.report(f"--candidates={args.candidates}")
    mesh = None
    if args.teacher != "bm25":
        import jax

        from samtone_jax.models import partitioning

        mesh = partitioning.create_mesh(devices=jax.local_devices())
    if (args.step is not None or args.vocabulary) and teachers.detect_kind(
        args.teacher, args.teacher_kind
    ) != "samtone":
        raise BadValueError("--step and --vocabulary choose a samtone teacher's checkpoint and vocabulary only")
    teacher = teachers.load_teacher(
        args.teacher,
        args.teacher_kind,
        step=args.step,
        vocabulary=args.vocabulary,
        batch_size=args.batch_size,
        mesh=mesh,
    )
    invocation = {"task": args.task, "split": split, "candidates": args.candidates}
    summary = scoring.score(
        collection,
        args.out,
        teacher,
        candidates=candidates,
        depth=args.depth,
        shard_size=args.shard_size,
        invocation=invocation,
    )
    print(
        f"{summary['queries']:,} queries of {args.task}/{split} scored by {summary['teacher']} -> {args.out}: "
        f"{summary['mean_candidates']:.1f} candidates a query ({summary['shards_reused']} of {summary['shards']} "
        f"shards reused); counts in {args.out}.json"
    )
    return 0
