"""Packing contrastive pairs into rows: several texts per row up to a token budget (T5X's
convention: `*_segment_ids` 1, 2, ... per text and 0 for padding, `*_positions` from 0 in each
text), with every shape static.

A packed batch holds at most `max_pairs` pairs. Queries go into `query_rows` rows of
`query_length` tokens; documents and their hard negatives into `doc_rows` rows of `doc_length`;
a row holds at most `max_segments` texts. Pairs are taken from the stream in order and placed
first-fit; the first pair that does not fit (or the `max_pairs`-th) closes the batch, so a batch
is a deterministic function of the stream and of where it starts. Texts are never split across
rows: the feature converter has already truncated each one to its row length (and counted it).

Where each pair's texts landed: `query_slot` / `doc_slot` [max_pairs] and `negative_slot`
[max_pairs, K] index the flattened [rows · max_segments] slots of the encoder's packed output
(DualEncoder.encode_packed), so row i of the contrastive batch is pair i of the stream whatever
rows its texts were packed into. `pair_mask` [max_pairs] is 1 for a real pair, 0 for an empty
slot (its ids are -1; the loss leaves it out of every term).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np

from samtone_jax.errors import BadValueError


@dataclasses.dataclass(frozen=True)
class PackingBudget:
    """The static shapes of a packed batch (see the module docstring)."""

    max_pairs: int
    query_rows: int
    query_length: int
    doc_rows: int
    doc_length: int
    max_segments: int
    num_negatives: int = 0

    def __post_init__(self):
        for name in ("max_pairs", "query_rows", "query_length", "doc_rows", "doc_length", "max_segments"):
            if getattr(self, name) < 1:
                raise BadValueError(f"packing budget: {name} = {getattr(self, name)} must be ≥ 1")
        if self.num_negatives < 0:
            raise BadValueError(f"packing budget: num_negatives = {self.num_negatives} must be ≥ 0")
        if 1 + self.num_negatives > self.doc_rows * self.max_segments:
            raise BadValueError(
                f"packing budget: a pair's document and {self.num_negatives} negatives need "
                f"{1 + self.num_negatives} document slots, more than doc_rows × max_segments = "
                f"{self.doc_rows} × {self.max_segments}"
            )


class _Rows:
    """`rows` rows of `length` tokens being filled first-fit, at most `segments` texts each."""

    def __init__(self, rows: int, length: int, segments: int):
        self.tokens = np.zeros((rows, length), np.int32)
        self.segment_ids = np.zeros((rows, length), np.int32)
        self.positions = np.zeros((rows, length), np.int32)
        self.used = np.zeros(rows, np.int64)  # tokens used per row
        self.count = np.zeros(rows, np.int64)  # texts per row
        self.length, self.segments = length, segments

    def find(self, sizes: list[int]) -> list[int] | None:
        """Rows for texts of `sizes` placed one after the other first-fit, or None if one does not fit."""
        used, count, where = self.used.copy(), self.count.copy(), []
        for n in sizes:
            fits = np.flatnonzero((used + n <= self.length) & (count < self.segments))
            if not len(fits):
                return None
            row = int(fits[0])
            used[row] += n
            count[row] += 1
            where.append(row)
        return where

    def put(self, text: np.ndarray, row: int) -> int:
        """Write `text` at the end of `row`; returns its slot (row · segments + its index in the row)."""
        at, n, index = int(self.used[row]), len(text), int(self.count[row])
        self.tokens[row, at : at + n] = text
        self.segment_ids[row, at : at + n] = index + 1
        self.positions[row, at : at + n] = np.arange(n)
        self.used[row] += n
        self.count[row] += 1
        return row * self.segments + index


def _text(example: dict, key: str, length: int, where: str) -> np.ndarray:
    text = np.asarray(example[key], np.int32)
    text = text[text != 0]  # the converter's padding, if any
    if len(text) > length:
        raise BadValueError(
            f"{where}: a {key} of {len(text)} tokens is longer than its row ({length}); it must be truncated "
            "before packing (the feature converter does)"
        )
    if not len(text):
        raise BadValueError(f"{where}: an empty {key} (a text is at least its EOS token)")
    return text


def pack_pairs(examples: Iterable[dict], budget: PackingBudget, start: int = 0) -> Iterator[tuple[dict, int]]:
    """(packed batch, stream position after it) for the examples of the stream from position `start`
    on. An example: `query_tokens`, `doc_tokens` (EOS-terminated ids; zero padding ignored),
    optionally `negative_tokens` [K, L], and the ids `query_id`, `doc_id`, `negative_ids`."""
    b, k = budget, budget.num_negatives
    position, batch, pending = start, None, None
    stream = iter(examples)
    while True:
        if pending is None:
            example = next(stream, None)
            if example is None:
                if batch is not None and batch["pairs"]:
                    yield _finish(batch, b), position
                return
            where = f"stream position {position}"
            q = _text(example, "query_tokens", b.query_length, where)
            docs = [_text(example, "doc_tokens", b.doc_length, where)]
            if k:
                negatives = list(example["negative_tokens"])[:k]  # [K, L] padded, or K ragged texts
                docs += [_text({"negative_tokens": n}, "negative_tokens", b.doc_length, where) for n in negatives]
            pending = (example, q, docs)
        if batch is None:
            batch = _empty(b)
        example, q, docs = pending
        q_row = batch["queries"].find([len(q)])
        d_rows = batch["documents"].find([len(d) for d in docs])
        if q_row is None or d_rows is None or batch["pairs"] == b.max_pairs:
            if not batch["pairs"]:
                raise BadValueError(
                    f"stream position {position}: one pair ({len(q)} query tokens, {[len(d) for d in docs]} "
                    f"document tokens) does not fit an empty batch of {b.query_rows} × {b.query_length} query and "
                    f"{b.doc_rows} × {b.doc_length} document tokens, {b.max_segments} texts a row"
                )
            yield _finish(batch, b), position
            batch = None
            continue
        i = batch["pairs"]
        batch["query_slot"][i] = batch["queries"].put(q, q_row[0])
        slots = [batch["documents"].put(d, row) for d, row in zip(docs, d_rows, strict=True)]
        batch["doc_slot"][i] = slots[0]
        if k:
            batch["negative_slot"][i] = slots[1:]
            batch["negative_ids"][i] = np.asarray(example["negative_ids"])[:k]
        batch["query_id"][i], batch["doc_id"][i] = example["query_id"], example["doc_id"]
        batch["pair_mask"][i] = 1
        batch["pairs"] += 1
        position += 1
        pending = None


def _empty(b: PackingBudget) -> dict:
    batch = {
        "queries": _Rows(b.query_rows, b.query_length, b.max_segments),
        "documents": _Rows(b.doc_rows, b.doc_length, b.max_segments),
        "pairs": 0,
        "query_slot": np.zeros(b.max_pairs, np.int32),
        "doc_slot": np.zeros(b.max_pairs, np.int32),
        "pair_mask": np.zeros(b.max_pairs, np.int32),
        "query_id": np.full(b.max_pairs, -1, np.int64),
        "doc_id": np.full(b.max_pairs, -1, np.int64),
    }
    if b.num_negatives:
        batch["negative_slot"] = np.zeros((b.max_pairs, b.num_negatives), np.int32)
        batch["negative_ids"] = np.full((b.max_pairs, b.num_negatives), -1, np.int64)
    return batch


def _finish(batch: dict, b: PackingBudget) -> dict:
    out = {k: v for k, v in batch.items() if k not in ("queries", "documents", "pairs")}
    for prefix, rows in (("query", batch["queries"]), ("doc", batch["documents"])):
        out[f"{prefix}_tokens"] = rows.tokens
        out[f"{prefix}_segment_ids"] = rows.segment_ids
        out[f"{prefix}_positions"] = rows.positions
    return out
