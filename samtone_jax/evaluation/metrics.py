"""Ranking metrics through ir-measures, from a run {query id: {doc id: score}}."""

from __future__ import annotations

import ir_measures
from ir_measures import RR, P, R, nDCG

DEFAULT_MEASURES = (P @ 1, RR, RR @ 10, R @ 1, R @ 5, R @ 10, R @ 100, R @ 1000, nDCG @ 10)


def measures_for_depth(k: int, measures=DEFAULT_MEASURES) -> list:
    """The measures a top-`k` run can compute faithfully (R@1000 needs 1,000 retrieved documents)."""
    return [m for m in measures if m.params.get("cutoff") is None or m.params["cutoff"] <= k]


def run_from_top_k(query_ids, doc_ids, scores, indices) -> dict[str, dict[str, float]]:
    """A TREC-style run from exact_top_k's output (indices into doc_ids)."""
    return {
        q: {doc_ids[j]: float(s) for s, j in zip(row_scores, row_ids, strict=True) if j >= 0}
        for q, row_scores, row_ids in zip(query_ids, scores, indices, strict=True)
    }


def _judged(qrels, run):
    return {q: {d: int(r) for d, r in docs.items()} for q, docs in qrels.items() if q in run}


def evaluate(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]], measures=DEFAULT_MEASURES):
    """{measure name: mean over the queries of `run`}; a query with no relevant document is skipped
    by ir-measures, as by trec_eval."""
    aggregate = ir_measures.calc_aggregate(list(measures), _judged(qrels, run), run)
    return {str(m): float(aggregate[m]) for m in measures if m in aggregate}  # in the order asked for


def per_query(qrels, run, measures=DEFAULT_MEASURES) -> dict[str, dict[str, float]]:
    """{measure name: {query id: value}}: what paired significance tests compare."""
    out = {str(m): {} for m in measures}
    for metric in ir_measures.iter_calc(list(measures), _judged(qrels, run), run):
        out[str(metric.measure)][metric.query_id] = float(metric.value)
    return out
