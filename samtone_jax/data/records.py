"""Reading record files line by line with errors that name the file and the line.

Every reader goes through `read_lines` / `read_jsonl`, so a malformed record always fails as
`BadRecordError: <file>:<line>: <what>` — or, with `skip_bad_records=True`, is skipped and
counted in `ReadStats`, which the task reports at the end. Local paths and `gs://` (the path
layer); `.gz` files are decompressed on the fly.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import io
import json
import logging
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError, MissingFileError

log = logging.getLogger(__name__)


class BadRecordError(BadValueError):
    """A record that does not parse; the message starts with `file:line:`."""


SKIP_HINT = (
    "to skip and count bad lines: --skip_bad_records (samtone encode / mine / analyze / build-vocab / "
    "data-stats) or gin `skip_bad_records.enabled = True` (train, eval, train-adore)"
)


class ReadStats(collections.Counter):
    """Counts of what a reader skipped or found wrong (bad records, empty texts, missing docs)."""

    def report(self, what: str) -> None:
        problems = {k: v for k, v in self.items() if v}
        if problems:
            log.warning("%s: %s", what, ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in sorted(problems.items())))


class UniqueIds:
    """Every reader's one rule for ids (BEIR, MS MARCO, MultiReQA, SQuAD, WordNet, your own files):
    an id repeated with the same text is counted (`duplicate_<kind>_lines`) and read once; with
    another text it is an error naming both lines, never a silent overwrite of the text a judgement
    was made on."""

    def __init__(self, path: str, kind: str, stats: ReadStats):
        self.path, self.kind, self.stats = path, kind, stats
        self.table: dict[str, str] = {}
        self._first: dict[str, int] = {}

    def add(self, line: int, key: str, text: str) -> bool:
        """Whether `key` is new (a same-text repeat: counted, False; another text: BadRecordError)."""
        if key not in self.table:
            self.table[key], self._first[key] = text, line
            return True
        if self.table[key] != text:
            raise BadRecordError(
                f"{self.path}:{line}: {self.kind} id {key!r} is also on line {self._first[key]} with another text; "
                "ids must be unique"
            )
        self.stats[f"duplicate_{self.kind}_lines"] += 1
        return False


def unique_ids(rows, path: str, kind: str, stats: ReadStats) -> dict[str, str]:
    """{id: text} of numbered (line, (id, text)) rows, by UniqueIds' rule."""
    ids = UniqueIds(path, kind, stats)
    for line, (key, text) in rows:
        ids.add(line, key, text)
    return ids.table


@contextlib.contextmanager
def open_binary(path: str) -> Iterator[io.BufferedIOBase]:
    """A byte stream over a local or gs:// file, gunzipped when it ends in .gz."""
    try:
        raw = paths.as_path(path).open("rb")
    except IsADirectoryError:
        raise BadValueError(f"{path} is a folder; a file is expected here") from None
    except FileNotFoundError as e:
        raise MissingFileError(
            f"{path} not found (a built-in task's files are under the data root: gin data_dir.path, "
            "$SAMTONE_DATA_DIR or --data_dir; a local_tasks path is as written, relative to the working directory)"
        ) from e
    with raw:
        yield gzip.GzipFile(fileobj=raw) if str(path).endswith(".gz") else raw


@contextlib.contextmanager
def open_text(path: str) -> Iterator[io.TextIOBase]:
    """A UTF-8 text stream over a local or gs:// file, gunzipped when it ends in .gz."""
    with open_binary(path) as stream:
        yield io.TextIOWrapper(stream, encoding="utf-8")


def exists(path: str) -> bool:
    return paths.as_path(path).exists()


def read_lines(
    path: str,
    parse: Callable[[str], Any],
    stats: ReadStats,
    skip_bad_records: bool = False,
    skip_first: bool = False,
    numbered: bool = False,
) -> Iterator[Any]:
    """Yield parse(line) (numbered: (line number, parse(line))) for each non-empty line; a failure
    (bad UTF-8 included) names file:line (or is counted). Lines are decoded one by one, inside the
    per-line check."""
    with open_binary(path) as f:
        lines, number = iter(f), 0
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                return
            except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # a cut-short download, a corrupt .gz
                raise BadRecordError(
                    f"{path}: unreadable after line {number} ({type(e).__name__}: {e}): the file is truncated "
                    "or corrupt; download or copy it again"
                ) from e
            number += 1
            try:
                line = raw.decode("utf-8")
                if (skip_first and number == 1) or not line.strip():
                    continue
                parsed = parse(line.rstrip("\r\n"))
            except (ValueError, KeyError, TypeError, IndexError) as e:  # UnicodeDecodeError is a ValueError
                if not skip_bad_records:
                    raise BadRecordError(f"{path}:{number}: {type(e).__name__}: {e} ({SKIP_HINT})") from e
                stats["bad_records"] += 1
                continue
            yield (number, parsed) if numbered else parsed


def read_jsonl(
    path: str, stats: ReadStats, skip_bad_records: bool = False, require=(), numbered: bool = False
) -> Iterator[dict]:
    """JSON objects one per line (numbered: with line numbers); `require` names keys that must be present."""
    yield from read_lines(path, lambda line: json_object(line, require), stats, skip_bad_records, numbered=numbered)


def json_object(line: str, require=()) -> dict:
    """One JSON-lines record: an object with the keys `require` names."""
    record = json.loads(line)
    if not isinstance(record, dict):
        raise BadValueError(f"expected a JSON object, got {type(record).__name__}")
    missing = [k for k in require if k not in record]
    if missing:
        raise KeyError(f"missing field(s) {missing}")
    return record


def read_tsv(
    path: str, columns: int, stats: ReadStats, skip_bad_records: bool = False, header: bool = False, numbered=False
):
    """Tab-separated rows of exactly `columns` fields (the last may contain no tab); numbered: with
    line numbers."""

    def parse(line: str) -> list[str]:
        fields = line.split("\t")
        if len(fields) != columns:
            raise BadValueError(f"expected {columns} tab-separated fields, got {len(fields)}")
        return fields

    yield from read_lines(path, parse, stats, skip_bad_records, skip_first=header, numbered=numbered)
