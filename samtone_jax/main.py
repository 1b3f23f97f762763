"""T5X-style entry point: `python -m samtone_jax.main --run_mode=<mode> [flags]`.

Same modes and flags as the `samtone` console script (see samtone_jax/cli/main.py).
"""

from __future__ import annotations

import sys

from samtone_jax.cli import main as cli


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    modes = [a for a in argv if a.startswith("--run_mode=")]
    if len(modes) != 1:
        print("usage: python -m samtone_jax.main --run_mode=<mode> [flags]  (see `samtone --help`)", file=sys.stderr)
        return 2
    argv.remove(modes[0])
    return cli.main([modes[0].split("=", 1)[1], *argv])


if __name__ == "__main__":
    sys.exit(main())
