"""`samtone average`: a soup: the weight average of checkpoints of one model (uniform or greedy)."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags, runtime
from samtone_jax.core.errors import BadValueError, ExistingFileError

NAME = "average"
HELP = "a soup: the weight average of checkpoints of one model (uniform or greedy)"
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
    p.add_argument("--task", default=None, help="greedy soup: the validation task (default: uniform, no task)")
    p.add_argument("--split", default=None, help="its split (default: train, else its first)")
    p.add_argument("--measure", default=None, help="the measure the greedy soup maximises (default RR), e.g. P@1")
    p.add_argument(
        "--max_queries", type=int, default=None, help="an even sample of this many validation queries (2000)"
    )
    p.add_argument("--candidates", type=int, default=None, help="rank among this many documents (default: all)")
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
    found = soup.ingredients(args.checkpoints, args.last)
    if args.weights is not None and args.task:
        raise BadValueError("--weights mixes the checkpoints as given; a greedy soup (--task) chooses its own")
    weights = soup.check_weights(args.weights, found) if args.weights is not None else None
    method = "greedy" if args.task else "weighted" if weights else "uniform"
    info = {"averaged": [i.label for i in found], "method": method}
    if weights:
        info["weights"] = [w / sum(weights) for w in weights]
    if args.task:
        if jax.process_count() > 1:
            raise BadValueError(
                "a greedy soup (--task) runs on one host: run it without the distributed flags (on a pod: "
                "launch/tpu/run.sh ... --worker=0 average -- ...), or drop --task for a uniform soup"
            )
        split, collection = runtime.load_task(args)
        score, measure = soup.validation_score(found[0].label, args.task, collection, args)
        params, kept, scores = soup.greedy(found, score)
        info |= {"kept": kept, "validation": f"{args.task}/{split}", "measure": measure, "scores": scores}
        print("\n".join(f"  {label}: {measure} {value:.4f}" for label, value in scores.items()))
    else:
        # A pod's hosts: each ingredient restored sharded, every process its shards (one host: NumPy).
        mesh = partitioning.create_mesh() if jax.process_count() > 1 else None
        params = soup.uniform(found, mesh, weights)
        kept = info["averaged"]
    out = soup.write(args.out, params, found, info, overwrite=args.overwrite)
    print(f"{info['method']} soup of {len(kept)} of {len(found)} checkpoints -> {out}")
    return 0
