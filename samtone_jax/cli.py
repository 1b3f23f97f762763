"""The `samtone` console script: `samtone <mode> [--gin_file=F ...] [--gin.NAME=VALUE ...] [flags]`.

Gin overrides use T5X's spelling, `--gin.NAME=VALUE` (e.g. `--gin.MODEL_DIR="'/tmp/run'"`), and
`--gin_bindings="NAME = VALUE"` works too. `python -m samtone_jax.main --run_mode=<mode>` is the
same entry point for T5X users.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _split_gin_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Pull `--gin.NAME=VALUE` out of argv as gin bindings `NAME = VALUE`."""
    rest, bindings = [], []
    for arg in argv:
        if arg.startswith("--gin."):
            name, sep, value = arg[len("--gin.") :].partition("=")
            if not sep:
                raise SystemExit(f"samtone: {arg!r} needs a value: --gin.{name}=VALUE")
            bindings.append(f"{name} = {value}")
        else:
            rest.append(arg)
    return rest, bindings


def _add_gin_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gin_file", action="append", default=[], help="gin file(s), applied in order")
    parser.add_argument("--gin_bindings", action="append", default=[], help="extra gin binding(s)")


def _cmd_import_checkpoint(args, bindings) -> int:
    import gin

    from samtone_jax import gin_utils
    from samtone_jax.checkpoints import import_params, save_params

    gin_utils.parse(args.gin_file, args.gin_bindings + bindings)
    model = gin_utils.model()
    params, info = import_params(args.format, args.src, model, seed=args.seed)
    out = save_params(args.dst, params, gin.config_str(), info, overwrite=args.overwrite)
    n = sum(x.size for x in __import__("jax").tree_util.tree_leaves(params))
    print(
        f"imported {info['variables_used']} variables ({n:,} parameters, architecture "
        f"{model.architecture}) from {args.src} -> {out}; "
        f"{len(info['unused_variables'])} source variables unused (listed in {out}/info.json)"
    )
    return 0


def _cmd_demo(args, bindings) -> int:
    from samtone_jax import demo

    return demo.main(args.gin_file, args.gin_bindings + bindings)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="samtone", description=__doc__.splitlines()[0])
    parser.add_argument("--verbosity", default="INFO", help="logging level (DEBUG, INFO, WARNING)")
    sub = parser.add_subparsers(dest="mode", required=True, metavar="mode")

    p = sub.add_parser("import-checkpoint", help="convert a HF / T5X / Mesh-TF T5 checkpoint to ours")
    _add_gin_flags(p)
    p.add_argument("--format", required=True, choices=["hf", "t5x", "mtf"])
    p.add_argument("--src", required=True, help="source checkpoint (folder, file or TF prefix)")
    p.add_argument("--dst", required=True, help="output parameter checkpoint directory")
    p.add_argument("--seed", type=int, default=0, help="seed for a projection the source lacks")
    p.add_argument("--overwrite", action="store_true", help="replace --dst if it exists")
    p.set_defaults(run=_cmd_import_checkpoint)

    p = sub.add_parser("demo", help="the embedded end-to-end example (tiny model, CPU)")
    _add_gin_flags(p)
    p.set_defaults(run=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, bindings = _split_gin_overrides(argv)
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.verbosity.upper(), format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax._src", "tensorflow", "h5py"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return args.run(args, bindings)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        # User errors: one clear line, no traceback (--verbosity=DEBUG shows it).
        logging.getLogger("samtone").debug("traceback", exc_info=True)
        print(f"samtone {args.mode}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
