"""The `samtone` console script: `samtone <mode> [--gin_file=F ...] [--gin.NAME=VALUE ...] [flags]`.

Each mode is one module of this folder (`NAME`, `HELP`, `EXAMPLE`, `add_flags(parser)`,
`run(args, bindings)`); MODES lists them. Gin overrides use T5X's spelling, `--gin.NAME=VALUE` (e.g.
`--gin.MODEL_DIR="'/tmp/run'"`), and `--gin_bindings="NAME = VALUE"` works too. `python -m
samtone_jax.main --run_mode=<mode>` is the same entry point for T5X users.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from samtone_jax.cli import (
    analyze,
    average,
    build_vocab,
    calibrate,
    compare,
    data_stats,
    demo,
    encode,
    evaluate,
    export,
    finetune,
    flags,
    import_checkpoint,
    list_tasks,
    mine,
    runtime,
    score,
    train,
    train_adore,
)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's INFO lines; its CUDA probe: tensorflow_setup.py

# The modes, in the order `samtone --help` lists them.
MODES = (
    finetune,
    import_checkpoint,
    train,
    train_adore,
    evaluate,
    calibrate,
    average,
    encode,
    analyze,
    export,
    mine,
    score,
    compare,
    build_vocab,
    data_stats,
    list_tasks,
    demo,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="samtone", description=__doc__.splitlines()[0])
    parser.add_argument("--verbosity", default="INFO", help="logging level (DEBUG, INFO, WARNING)")
    parser.add_argument(
        "--compilation_cache",
        default=None,
        help="folder (or gs:// URL) of JAX's persistent compilation cache, or 'off' (default: "
        "$SAMTONE_COMPILATION_CACHE, else ~/.cache/samtone_jax/xla/<this CPU>; core/compilation_cache.py)",
    )
    subparsers = parser.add_subparsers(dest="mode", required=True, metavar="mode")
    for mode in MODES:
        p = subparsers.add_parser(
            mode.NAME, help=mode.HELP, formatter_class=flags.HelpFormatter, epilog=f"example:\n  {mode.EXAMPLE}"
        )
        mode.add_flags(p)
        p.set_defaults(run=runtime.with_gin(mode.run) if mode.PARSES_GIN else mode.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from samtone_jax.core import run_clock

    if argv is not None:  # a mode run in a process that may have run others: its own clock
        run_clock.restart()
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, bindings = flags.split_gin_overrides(argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.verbosity.upper(), format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax._src", "tensorflow", "h5py"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from samtone_jax.core.errors import UserError, one_line

    if bindings and not hasattr(args, "gin_file"):
        given = bindings[0].replace(" = ", "=", 1)
        print(f"samtone {args.mode}: error: this mode takes no gin settings (got --gin.{given})", file=sys.stderr)
        return 2
    try:
        from samtone_jax.core import compilation_cache

        compilation_cache.enable(args.compilation_cache)  # before anything is compiled
        return args.run(args, bindings)
    except UserError as e:
        # What the user can fix: one clear line (--verbosity=DEBUG shows the traceback). Anything
        # else (a bug, a library's own error) keeps its traceback.
        logging.getLogger("samtone").debug("traceback", exc_info=True)
        print(f"samtone {args.mode}: error: {one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
