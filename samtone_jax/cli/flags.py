"""The flags modes share, the help format every mode uses, and the plain-flag tables that map flags
onto gin names (one table per mode: the flag, its gin name, its type and its help)."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from samtone_jax.core.errors import BadValueError


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default (when it has one the help does not already state);
    the epilog (an example) keeps its lines."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if action.option_strings and "default" not in text and default not in (None, False, [], argparse.SUPPRESS):
            text += f" (default: {default})"
        return text


class Deprecated(argparse.Action):
    """An old spelling of a flag: still works, says the new one on stderr (scripts keep running)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"samtone: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def out_flag(p: argparse.ArgumentParser, help: str) -> None:
    """--out, the one name of every mode's output (--dst: its old spelling in import-checkpoint / export)."""
    p.add_argument("--out", default=None, help=help + " (required)")
    p.add_argument("--dst", dest="out", action=Deprecated, new="--out")


def split_gin_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
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


def gin_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gin_file", action="append", default=[], help="gin file(s), applied in order")
    parser.add_argument("--gin_bindings", action="append", default=[], help="extra gin binding(s)")


def distributed_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--multihost", action="store_true", help="jax.distributed.initialize() from the environment (TPU)")
    p.add_argument("--coordinator_address", default=None, help="host:port of process 0 (multi-process)")
    p.add_argument(
        "--num_processes", type=int, default=None, help="processes in all (multi-process, with --process_id)"
    )
    p.add_argument("--process_id", type=int, default=None, help="this process's index in [0, --num_processes)")
    p.add_argument("--num_cpu_devices", type=int, default=None, help="CPU devices per process (testing)")
    p.add_argument(
        "--heartbeat_timeout_seconds",
        type=int,
        default=100,
        help="a process silent this long (killed, lost) makes the others exit, not hang",
    )


def checkpoint_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a MODEL_DIR, MODEL_DIR/checkpoints/<step> or parameter dir")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--vocabulary", default=None, help="SentencePiece .model or tokenizer.json (default: the run's)")
    p.add_argument("--query_length", type=int, default=None, help="default: the run's train.query_length")
    p.add_argument("--doc_length", type=int, default=None, help="default: the run's train.doc_length")


def weights_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--weights",
        choices=["params", "ema"],
        default="params",
        help="a run's parameters, or their moving average (a run trained with step.ema_decay)",
    )


def false_negative_flags(parser: argparse.ArgumentParser) -> None:
    """The cuts of data/false_negatives.FalseNegativeFilter (gin FalseNegativeFilter.* in training)."""
    parser.add_argument(
        "--margin", type=float, default=None, help="drop candidates scoring above the positive's score minus this"
    )
    parser.add_argument(
        "--relative_margin",
        type=float,
        default=None,
        help="drop candidates scoring above (1 - margin) x the positive's score",
    )
    parser.add_argument("--max_score", type=float, default=None, help="drop candidates scoring above this")


def task_flags(parser: argparse.ArgumentParser, task_help: str = "a task name (see `samtone tasks`)") -> None:
    parser.add_argument("--task", required=True, help=task_help)
    parser.add_argument(
        "--split", default=None, help="split (default: train if the task has one, else its first in `samtone tasks`)"
    )
    parser.add_argument("--data_dir", default=None, help="data root (default: $SAMTONE_DATA_DIR)")
    parser.add_argument("--skip_bad_records", action="store_true", help="skip and count malformed lines")


def items(values: list[str]) -> list[str]:
    """A list flag's values, given space- or comma-separated (`--dims 64 128` = `--dims 64,128`)."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def _ints(values: list[str], flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(k) for k in items(values))
    except ValueError:
        raise BadValueError(f"{flag} {' '.join(values)}: must be integers, e.g. 64,128,256") from None


def floats(values: list[str], flag: str) -> tuple[float, ...]:
    """A list flag's numbers (space- or comma-separated), or an error naming the flag."""
    try:
        return tuple(float(k) for k in items(values))
    except ValueError:
        raise BadValueError(f"{flag} {' '.join(values)}: must be numbers, e.g. 0,0.5,1") from None


@dataclasses.dataclass(frozen=True)
class GinFlag:
    """A plain flag that sets one gin parameter: `--task=x` binds `train.task = 'x'` over whatever a gin
    file set (the flag wins). `kind` is str, int, float, a flag without value (`switch`), or a list
    (`strings` / `integers`: space- or comma-separated values, bound as a tuple)."""

    flag: str
    gin: str
    help: str
    kind: object = str

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--")

    def add(self, p: argparse.ArgumentParser) -> None:
        text = f"{self.help} (gin {self.gin})"
        if self.kind == "switch":
            p.add_argument(self.flag, action="store_true", help=text)
        elif self.kind in ("strings", "integers"):
            p.add_argument(self.flag, nargs="+", default=None, help=text)
        else:
            p.add_argument(self.flag, type=self.kind, default=None, help=text)

    def binding(self, args) -> str | None:
        value = getattr(args, self.dest, None)
        if value is None or value is False:
            return None
        if self.kind == "switch":
            value = True
        elif self.kind == "integers":
            value = _ints(value, self.flag)
        elif self.kind == "strings":
            value = tuple(items(value))
        return f"{self.gin} = {value!r}"


def add_table(p: argparse.ArgumentParser, table: tuple[GinFlag, ...]) -> None:
    for flag in table:
        flag.add(p)


def table_bindings(args, table: tuple[GinFlag, ...]) -> list[str]:
    """The gin bindings of the table's flags that were given (appended last: a flag wins)."""
    return [b for b in (flag.binding(args) for flag in table) if b is not None]
