"""Packing a contrastive batch into rows: several texts per row, each a contiguous run of its row
(T5X's convention: `*_segment_ids` 1, 2, ... per text and 0 for padding; the encoder needs no
per-text positions, see models/t5.T5Encoder).

The batch keeps its pairs: the same B pairs as unpacked, in the same order, so the loss, the ids
and resuming (step k = batch k of the pipeline) are exactly what they are without packing. Only
the token arrays change: each data-parallel device's pairs (a contiguous block of B / D, as the
batch is sharded) are packed into that device's own rows — its queries into query rows, its
documents and hard negatives into document rows — first-fit decreasing, at most `max_segments`
texts a row. `query_slot` / `doc_slot` [B] and `negative_slot` [B, K] say where each text went:
an index into the flattened [rows · max_segments] output of DualEncoder.encode_packed, global
over the devices' row blocks.

Shapes stay static: the row count per device is the largest any device needs, rounded up to
`row_bits` significant binary digits (`round_rows`; then to a multiple of `row_multiple`, which
GradCache sets to its chunk), so a run compiles once per row count it meets (a few: the batches'
token totals vary little) and never fails for a long batch. `min_rows` raises the counts to a floor: the
training loop sets it to the most rows the run's first batches need (train_batches.Packing.row_sample),
so after warm-up nearly every batch has the one compiled shape instead of a new compilation whenever its
count first appears. Rounding relative to the count keeps
the extra rows a few per cent at every scale: exact up to 2^row_bits rows (a pod's few rows per
chip), 8 counts per doubling above it with the default 3. Texts are never split across rows;
the feature converter has already truncated each one to its row length and counted it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from samtone_jax.core.errors import BadValueError

PAD_ID = 0


@dataclasses.dataclass(frozen=True)
class Packed:
    """One side's packed rows and where each text went (flat slot index)."""

    tokens: np.ndarray  # [rows, length] int32
    segment_ids: np.ndarray  # [rows, length] int32, 1..max_segments per text, 0 = padding
    slots: np.ndarray  # [texts] int32: row · max_segments + index in the row


def round_rows(rows: int, bits: int, multiple: int = 1) -> int:
    """`rows` rounded up to its first `bits` binary digits, then to a multiple of `multiple`
    (bits 3: 7 -> 7, 13 -> 14, 17 -> 20, 33 -> 40)."""
    step = 1 << max(0, rows.bit_length() - bits)
    rows = -(-rows // step) * step
    return -(-rows // multiple) * multiple


def _lengths(texts: np.ndarray) -> np.ndarray:
    """Real tokens per text of [n, L] zero-padded ids (a text is its ids up to the last non-zero)."""
    nonzero = texts != PAD_ID
    return np.where(nonzero.any(axis=1), texts.shape[1] - np.argmax(nonzero[:, ::-1], axis=1), 0)


def assign_rows(lengths: np.ndarray, length: int, max_segments: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(row, index in row) per text and the rows used: first-fit decreasing (longest first, each into
    the first row with room for it and fewer than `max_segments` texts; ties by position)."""
    if len(lengths) and lengths.max() > length:
        raise BadValueError(f"a text of {lengths.max()} tokens is longer than its row ({length}): truncate it first")
    order = np.argsort(-lengths, kind="stable")
    used = np.zeros(len(lengths), np.int64)  # at most one row per text
    count = np.zeros(len(lengths), np.int64)
    row, index = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    rows = 0
    for t in order:
        fits = np.flatnonzero((used[:rows] + lengths[t] <= length) & (count[:rows] < max_segments))
        r = int(fits[0]) if len(fits) else rows
        rows = max(rows, r + 1)
        row[t], index[t] = r, count[r]
        used[r] += lengths[t]
        count[r] += 1
    return row, index, rows


def write_rows(texts: np.ndarray, lengths, row, index, rows: int, max_segments: int) -> Packed:
    """The texts [n, L] written into `rows` rows at (row, index), in index order within each row."""
    length = texts.shape[1]
    tokens, segment_ids = (np.zeros((rows, length), np.int32) for _ in range(2))
    at = np.zeros(rows, np.int64)
    for t in np.lexsort((index, row)):  # by row, then by index: each text after the earlier ones
        r, n = row[t], lengths[t]
        tokens[r, at[r] : at[r] + n] = texts[t, :n]
        segment_ids[r, at[r] : at[r] + n] = index[t] + 1
        at[r] += n
    return Packed(tokens, segment_ids, (row * max_segments + index).astype(np.int32))


def _place(blocks: list[np.ndarray], max_segments: int) -> tuple[list, int]:
    """(per block: texts, lengths, row, index), the most rows any block needs."""
    placed = []
    for texts in blocks:
        lengths = _lengths(texts)
        placed.append((texts, lengths, *assign_rows(lengths, texts.shape[1], max_segments)))
    return [p[:4] for p in placed], max(p[4] for p in placed)


def _write(placed: list, rows: int, max_segments: int, first_row: int) -> Packed:
    """Each block's texts into its own `rows` rows, blocks concatenated; slots global, counting from
    row `first_row` (this host's first row of the global array)."""
    parts = [write_rows(texts, lengths, row, index, rows, max_segments) for texts, lengths, row, index in placed]
    offsets = (first_row + np.arange(len(parts)) * rows) * max_segments
    return Packed(
        np.concatenate([p.tokens for p in parts]),
        np.concatenate([p.segment_ids for p in parts]),
        np.concatenate([p.slots + o for p, o in zip(parts, offsets, strict=True)]).astype(np.int32),
    )


def rows_needed(batch: dict[str, np.ndarray], devices: int, max_segments: int) -> tuple[int, int]:
    """(query rows, document rows) the busiest device needs for this batch, before rounding."""
    return tuple(_place(blocks, max_segments)[1] for blocks in _device_blocks(batch, devices))


def _device_blocks(batch: dict[str, np.ndarray], devices: int) -> tuple[list, list]:
    """Each device's queries and each device's document block (its documents, then its pairs' negatives)."""
    b = batch["query_tokens"].shape[0]
    if b % devices:
        raise BadValueError(f"packing: a batch of {b} pairs does not split over {devices} devices")
    per = b // devices
    k = batch["negative_tokens"].shape[1] if "negative_tokens" in batch else 0
    negatives = batch["negative_tokens"].reshape(b * k, -1) if k else None
    doc_blocks = [
        np.concatenate(
            [batch["doc_tokens"][i * per : (i + 1) * per]] + ([negatives[i * per * k : (i + 1) * per * k]] if k else [])
        )
        for i in range(devices)
    ]
    return np.split(batch["query_tokens"], devices), doc_blocks


def pack_batch(
    batch: dict[str, np.ndarray],
    devices: int,
    max_segments: int,
    row_bits: int = 3,
    row_multiple: int = 1,
    agree=None,
    host_index: int = 0,
    min_rows: tuple[int, int] = (0, 0),
) -> dict:
    """A batch of model features (query_tokens [B, Lq], doc_tokens [B, Ld], negative_tokens
    [B, K, Ld], ids) -> the packed batch: the ids unchanged; query_/doc_ tokens and segment_ids
    [devices · R, L]; query_slot, doc_slot [B]; negative_slot [B, K]. See the module
    docstring.

    With several hosts, each packs its own pairs for its `devices`: `agree`((Rq, Rd)) returns the row
    counts every host uses (the largest), and `host_index` places this host's rows in the global
    array (its slots count from row host_index · devices · R). `min_rows` (queries, documents): at least
    this many rows per device (before rounding)."""
    if min(max_segments, row_bits, row_multiple) < 1:
        raise BadValueError(
            f"packing: max_segments ({max_segments}), row_bits ({row_bits}) and row_multiple ({row_multiple}) "
            "must be ≥ 1"
        )
    query_blocks, doc_blocks = _device_blocks(batch, devices)
    b = batch["query_tokens"].shape[0]
    per = b // devices
    k = batch["negative_tokens"].shape[1] if "negative_tokens" in batch else 0
    placed_q, rows_q = _place(query_blocks, max_segments)
    placed_d, rows_d = _place(doc_blocks, max_segments)
    rows_q, rows_d = (
        round_rows(max(r, m), row_bits, row_multiple) for r, m in zip((rows_q, rows_d), min_rows, strict=True)
    )
    if agree is not None:
        rows_q, rows_d = agree((rows_q, rows_d))
    queries = _write(placed_q, rows_q, max_segments, host_index * devices * rows_q)
    docs = _write(placed_d, rows_d, max_segments, host_index * devices * rows_d)
    out = {key: v for key, v in batch.items() if key not in ("query_tokens", "doc_tokens", "negative_tokens")}
    for prefix, packed in (("query", queries), ("doc", docs)):
        out[f"{prefix}_tokens"], out[f"{prefix}_segment_ids"] = packed.tokens, packed.segment_ids
    slots = docs.slots.reshape(devices, per * (1 + k))
    out["query_slot"] = queries.slots
    out["doc_slot"] = slots[:, :per].reshape(b)
    if k:
        out["negative_slot"] = slots[:, per:].reshape(b, k)
    return out
