"""Retrieval over compressed embeddings, as a serving index stores them (quantization.py): the
corpus and the queries in one precision, searched as stored on device (search.ExactIndex: int8
codes by their integer inner products, packed sign bits by Hamming distance), and optionally the
top k · `rescore` candidates re-ranked on device by the float query against each candidate's
decoded codes (sentence-transformers' rescoring: int8 codes dequantized, bits as ±1).

What one such search costs is measured beside it: bytes a document in the index, and queries a
second searched once compiled (a repeat of the first query batch).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from samtone_jax.compression import quantization
from samtone_jax.core.errors import BadValueError
from samtone_jax.evaluation import search


@dataclasses.dataclass(frozen=True)
class CompressedSearch:
    """(scores [Q, k], indices [Q, k]) of one precision, with what the index costs."""

    scores: np.ndarray
    indices: np.ndarray
    bytes_per_document: int
    queries_per_second: float
    precision: str

    def ranking_scores(self) -> np.ndarray:
        """Scores an evaluator ranks exactly as the index returned them: float32's own, else −rank.
        int8 / binary scores tie often (integers), and ir-measures / trec_eval would break the ties
        by document id, not by the index's order (the lower corpus index first)."""
        if self.precision == "float32":
            return self.scores
        return np.broadcast_to(-np.arange(self.scores.shape[1], dtype=np.float32), self.scores.shape)


def variants(precisions, rescore: int, names: tuple[str, str]) -> list[tuple[str, int]]:
    """(precision, rescore factor) of every search asked for: each precision as stored, and int8 /
    binary also rescored when `rescore` > 0; `names`: the two settings' names for errors."""
    precisions_name, rescore_name = names
    if not precisions or len(set(precisions)) != len(precisions):
        raise BadValueError(f"{precisions_name} must name distinct precisions; got {tuple(precisions)}")
    for precision in precisions:
        quantization.check_precision(precision, f"{precisions_name} entry")
    if rescore < 0:
        raise BadValueError(f"{rescore_name} must be >= 0 (0: no rescoring), got {rescore}")
    if rescore and set(precisions) <= {"float32"}:
        raise BadValueError(f"{rescore_name} re-ranks an int8 / binary index: add one to {precisions_name}")
    out = []
    for precision in precisions:
        out.append((precision, 0))
        if rescore and precision != "float32":
            out.append((precision, rescore))
    return out


def compressed_top_k(
    queries: np.ndarray,
    corpus: np.ndarray,
    precision: str,
    *,
    k: int = 100,
    ranges: np.ndarray | None = None,
    rescore_factor: int = 0,
    mesh=None,
    query_batch: int = 1024,
    chunk_size: int | None = None,
) -> CompressedSearch:
    """Float embeddings queries [Q, D] and corpus [N, D] searched at `precision` (float32, int8 with
    `ranges` [2, D] — quantization.int8_ranges of a calibration sample —, binary); `rescore_factor`
    R > 0 (int8 / binary): the top k · R re-ranked by the float queries. `chunk_size`: corpus rows a
    scan step scores (None: search.auto_chunk_size, tuned for a CPU's cache)."""
    quantization.check_precision(precision, "evaluate.precisions entry")
    if rescore_factor < 0:
        raise BadValueError(f"evaluate.rescore must be >= 0 (0: no rescoring), got {rescore_factor}")
    if precision == "int8" and ranges is None:
        raise BadValueError("int8 search needs ranges (quantization.int8_ranges of a calibration sample)")
    dim = corpus.shape[1]
    codes = quantization.encode(np.asarray(corpus, np.float32), precision, ranges)
    query_codes = quantization.encode(np.asarray(queries, np.float32), precision, ranges)
    bits = dim if precision == "binary" else None
    index = search.ExactIndex(
        codes,
        mesh,
        chunk_size=chunk_size,
        query_batch=query_batch,
        bits=bits,
        ranges=ranges if precision == "int8" else None,
    )
    queries = np.asarray(queries, np.float32)

    def run(first: int | None):
        if rescore_factor and precision != "float32":
            return index.search(query_codes[:first], k, float_queries=queries[:first], depth=k * rescore_factor)
        return index.search(query_codes[:first], k)

    scores, indices = run(None)
    start = time.perf_counter()
    run(query_batch)  # compiled by now: a query batch's search (and rescoring) at its own speed
    rate = min(len(queries), query_batch) / max(time.perf_counter() - start, 1e-9)
    return CompressedSearch(scores, indices, quantization.bytes_per_vector(precision, dim), rate, precision)
