"""`samtone compare`: eval JSONs side by side with paired significance tests."""

from __future__ import annotations

import argparse

from samtone_jax.cli import flags

NAME = "compare"
HELP = "eval JSONs side by side with paired significance tests"
EXAMPLE = (
    "samtone compare runs/a/eval/wordnet_definitions_test_step500.json "
    "runs/b/eval/wordnet_definitions_test_step500.json --measures P@1 RR"
)
PARSES_GIN = False  # it reads no gin, or parses its own


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="eval JSON files (MODEL_DIR/eval/*.json); the first is the baseline")
    p.add_argument(
        "--measures", nargs="+", default=None, help="measure names, e.g. P@1 RR or P@1,RR (default: all shared)"
    )
    p.add_argument(
        "--test", choices=["randomization", "bootstrap"], default="randomization", help="paired significance test"
    )
    p.add_argument("--trials", type=int, default=10000, help="random permutations / resamples of the test")
    p.add_argument("--seed", type=int, default=0, help="seed of the test")
    p.add_argument("--allow_partial", action="store_true", help="compare on the queries all runs share")


def run(args, bindings) -> int:
    from samtone_jax.evaluation import significance

    result = significance.compare(
        args.runs,
        measures=flags.items(args.measures) if args.measures else None,
        test=args.test,
        trials=args.trials,
        seed=args.seed,
        allow_partial=args.allow_partial,
    )
    print(significance.format_table(result))
    return 0
