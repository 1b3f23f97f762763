"""`samtone average`: a soup: the weight average of checkpoints of one model (uniform or greedy)."""

from __future__ import annotations

import argparse
import dataclasses

from samtone_jax.cli import flags, runtime
from samtone_jax.core.errors import BadValueError, ExistingFileError

NAME = "average"
HELP = "a soup: the weight average of checkpoints of one model (uniform, weighted, greedy or WiSE-FT picked)"
EXAMPLE = "samtone average --checkpoint runs/seed0 runs/seed1 runs/seed2 --out runs/soup"
PARSES_GIN = True  # runtime.with_gin parses --gin_file / --gin.NAME=VALUE before run


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint",
        dest="checkpoints",
        action="extend",
        nargs="+",
        default=None,
        help="the ingredients: runs (their latest step), step folders or parameter checkpoints; repeat the flag "
        "or list several (required)",
    )
    p.add_argument("--checkpoints", dest="checkpoints", nargs="+", action=flags.Deprecated, new="--checkpoint")
    p.add_argument("--last", type=int, default=None, help="with one run: the mean of its last K checkpoints")
    p.add_argument(
        "--weights",
        nargs="+",
        type=float,
        default=None,
        help="mixing weights, one a checkpoint (normalised to sum 1): e.g. a fine-tuned run and its base import "
        "--weights 0.7 0.3 (WiSE-FT); default: uniform",
    )
    flags.out_flag(p, "output parameter checkpoint (loadable, exportable, an INIT_CHECKPOINT)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument(
        "--task", default=None, help="greedy soup or --wise_ft: the validation task (default: uniform, no task)"
    )
    p.add_argument("--split", default=None, help="its split (default: train, else its first; --wise_ft: dev)")
    p.add_argument("--measure", default=None, help="the measure greedy / --wise_ft maximise (default RR), e.g. P@1")
    p.add_argument(
        "--max_queries", type=int, default=None, help="an even sample of this many validation queries (2000)"
    )
    p.add_argument("--candidates", type=int, default=None, help="rank among this many documents (default: all)")
    p.add_argument(
        "--wise_ft",
        action="store_true",
        help="with a fine-tuned run and its base (in that order) and --task: mix them as α·run + (1 − α)·base, α "
        "picked on --grid by the --task / --split score (default split: dev) among the α whose --guard tasks keep "
        "≥ --min_retention of the base's score",
    )
    p.add_argument("--guard", nargs="+", default=None, help="WiSE-FT: tasks the mix must keep its quality on")
    p.add_argument(
        "--min_retention", type=float, default=None, help="WiSE-FT: each guard's score ÷ the base's, at least (0.95)"
    )
    p.add_argument("--grid", nargs="+", default=None, help="WiSE-FT: the α tried (default 0, 0.1, ..., 1)")
    p.add_argument("--guard_queries", type=int, default=None, help="WiSE-FT: queries of each guard task (500)")
    p.add_argument(
        "--guard_candidates", type=int, default=None, help="WiSE-FT: documents each guard query is ranked among (5000)"
    )
    p.add_argument("--data_dir", default=None, help="data root (default: $SAMTONE_DATA_DIR)")
    p.add_argument("--skip_bad_records", action="store_true", help="skip and count malformed lines")
    flags.gin_flags(p)
    flags.distributed_flags(p)


def run(args, bindings) -> int:
    runtime.init_distributed(args)
    import jax

    from samtone_jax.core import paths
    from samtone_jax.evaluation import soup
    from samtone_jax.models import partitioning

    runtime.required(args, "out")
    runtime.required(args, "checkpoints", "--checkpoint")
    paths.check_bucket(args.out, "--out")
    paths.check_not_input(args.out, [i for c in args.checkpoints for i in runtime.model_inputs("--checkpoint", c)])
    if paths.as_path(args.out).exists() and not args.overwrite:  # before the slow part
        raise ExistingFileError(f"{args.out} already exists; choose another --out or pass --overwrite")
    greedy_flags = [f"--{k}" for k in ("split", "measure", "max_queries", "candidates") if getattr(args, k) is not None]
    if greedy_flags and not args.task:
        raise BadValueError(f"{', '.join(greedy_flags)} choose a greedy soup's validation: add --task")
    wise = ("guard", "grid", "min_retention", "guard_queries", "guard_candidates")
    wise_flags = [f"--{k}" for k in wise if getattr(args, k) is not None]
    if wise_flags and not args.wise_ft:
        raise BadValueError(f"{', '.join(wise_flags)} choose how --wise_ft picks its α: add --wise_ft")
    if args.wise_ft:
        if not args.task:
            raise BadValueError("--wise_ft picks α by the score on held-out in-domain queries: name them with --task")
        if args.last is not None or args.weights is not None:
            raise BadValueError(
                "--wise_ft mixes a fine-tuned run and its base (--checkpoint RUN BASE) by the α it picks: drop "
                + ("--last" if args.last is not None else "--weights")
            )
        args.min_retention = 0.95 if args.min_retention is None else args.min_retention
        args.guard_queries = 500 if args.guard_queries is None else args.guard_queries
        args.guard_candidates = 5000 if args.guard_candidates is None else args.guard_candidates
        if not 0 <= args.min_retention <= 1:
            raise BadValueError(f"--min_retention={args.min_retention}: a fraction of the base's score, in [0, 1]")
    grid = flags.floats(args.grid, "--grid") if args.grid is not None else soup.DEFAULT_GRID
    found = soup.ingredients(args.checkpoints, args.last)
    if args.weights is not None and args.task:
        raise BadValueError("--weights mixes the checkpoints as given; a greedy soup (--task) chooses its own")
    weights = soup.check_weights(args.weights, found) if args.weights is not None else None
    method = "wise-ft" if args.wise_ft else "greedy" if args.task else "weighted" if weights else "uniform"
    info = {"averaged": [i.label for i in found], "method": method}
    if weights:
        info["weights"] = [w / sum(weights) for w in weights]
    if args.task:
        if jax.process_count() > 1:
            raise BadValueError(
                "a greedy or WiSE-FT soup (--task) runs on one host: run it without the distributed flags (on a "
                "pod: launch/tpu/run.sh ... --worker=0 average -- ...), or drop --task for a uniform soup"
            )
        split, collection = runtime.load_task(args, default_split="dev" if args.wise_ft else "train")
        score, measure = soup.validation_score(found[0].label, args.task, collection, args)
    if args.wise_ft:
        params, picked, info["grid"] = _wise_ft(args, found, score, grid)
        info |= {"validation": f"{args.task}/{split}", "measure": measure, "alpha": picked.alpha}
        info["weights"] = [picked.alpha, 1 - picked.alpha]
        kept = info["averaged"]
    elif args.task:
        params, kept, scores = soup.greedy(found, score)
        info |= {"kept": kept, "validation": f"{args.task}/{split}", "measure": measure, "scores": scores}
        print("\n".join(f"  {label}: {measure} {value:.4f}" for label, value in scores.items()))
    else:
        # A pod's hosts: each ingredient restored sharded, every process its shards (one host: NumPy).
        mesh = partitioning.create_mesh() if jax.process_count() > 1 else None
        params = soup.uniform(found, mesh, weights)
        kept = info["averaged"]
    out = soup.write(args.out, params, found, info, overwrite=args.overwrite)
    if args.wise_ft:
        alpha = info["alpha"]
        print(f"WiSE-FT: α = {alpha:g} ({alpha:g} × {found[0].label} + {1 - alpha:g} × {found[1].label})")
    print(f"{info['method']} soup of {len(kept)} of {len(found)} checkpoints -> {out}")
    return 0


def _wise_ft(args, found, score, grid):
    """soup.wise_ft on `grid`, each --guard task scored on a split other than the one its evaluation
    reports (guard.guard_split: test, else dev, ...): its dev, else its train (guard tasks are not
    trained on), else another; the grid printed and returned as records."""
    from samtone_jax.evaluation import soup
    from samtone_jax.evaluation.guard import guard_split
    from samtone_jax.tasks import catalogue

    guards = {}
    for name in flags.items(args.guard or []):
        if name == args.task:
            raise BadValueError(
                f"--guard {name}: the validation task itself; a guard is a task the run did not train on"
            )
        if name not in catalogue.loaders():
            raise BadValueError(f"--guard {name}: unknown task; registered tasks: {', '.join(catalogue.task_names())}")
        splits, reported = catalogue.loaders()[name][1], guard_split(name)
        others = [s for s in ("dev", "train", *splits) if s in splits and s not in (reported, "all")]
        if not others:
            raise BadValueError(
                f"--guard {name}: its only split is the one its evaluation reports ({reported}); α picked on it "
                "would be reported on the queries it was picked on: choose a guard task with another split"
            )
        split = others[0]
        collection = catalogue.collection(name, split)
        guards[f"{name}/{split}"], _ = soup.validation_score(
            found[0].label, name, collection, args, args.guard_queries, args.guard_candidates
        )
    params, picked, mixes = soup.wise_ft(found, score, guards, grid, args.min_retention)
    print(f"{'α':>5} {args.measure or 'RR':>8} " + " ".join(f"{g + ' kept':>28}" for g in guards))
    for m in mixes:
        cells = " ".join(f"{m.retention[g]:28.1%}" for g in guards)
        print(
            f"{m.alpha:5.2f} {m.score:8.4f} {cells}"
            + ("  <- picked" if m is picked else "" if m.allowed else "  (guard)")
        )
    records = [dataclasses.asdict(m) for m in mixes]
    return params, picked, records
