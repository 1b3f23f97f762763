"""`samtone mine`: hard negatives for a task's training queries, from a trained model or BM25.

For every query: retrieve the top `range_max` documents, keep ranks [range_min, range_max)
(0-based, counted in the retrieved list), drop the query's known positives, drop the candidates
the false-negative filter flags (data/false_negatives.py: scored above the positive's score less a
margin, above (1 − relative_margin) × it, or above a max score: unlabelled relevant documents
score like the positive; counted as `dropped_as_false_negatives`), and keep `num_negatives` of the
rest: the best-ranked ('top') or a seeded random sample ('sample'). Written as the TSV the tasks
read (`query_id \\t doc_id,doc_id,...`; attach it to any task with gin `hard_negatives_file.path`).
"""

from __future__ import annotations

import json
import logging

import numpy as np

from samtone_jax.core.atomic_file import atomic_open, write_atomic
from samtone_jax.core.errors import BadValueError
from samtone_jax.data.false_negatives import FalseNegativeFilter

log = logging.getLogger(__name__)

STRATEGIES = ("top", "sample")


def select_negatives(
    ranked: np.ndarray,
    scores: np.ndarray,
    positives: list[set[int]],
    positive_scores: np.ndarray,
    *,
    num_negatives: int,
    range_min: int = 0,
    range_max: int | None = None,
    false_negatives: FalseNegativeFilter = FalseNegativeFilter(),
    strategy: str = "top",
    seed: int = 0,
) -> tuple[list[list[int]], int]:
    """(per query the chosen negative document indices, best rank first or a random sample; how many
    candidates in the rank window the filter dropped).

    ranked [Q, R] int document indices best first (-1 = none), scores [Q, R] their scores,
    positives: each query's relevant indices, positive_scores [Q]: the score of its (best) positive.
    """
    if strategy not in STRATEGIES:
        raise BadValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if not 0 <= range_min < (range_max or ranked.shape[1] + 1):
        raise BadValueError(f"need 0 <= range_min < range_max; got [{range_min}, {range_max})")
    rng = np.random.default_rng(seed)
    out, dropped = [], 0
    for row, row_scores, gold, gold_score in zip(ranked, scores, positives, positive_scores, strict=True):
        window = slice(range_min, range_max)
        candidates = [
            (int(j), s) for j, s in zip(row[window], row_scores[window], strict=True) if j >= 0 and j not in gold
        ]
        flagged = false_negatives.flags([s for _, s in candidates], gold_score)
        keep = [j for (j, _), f in zip(candidates, flagged, strict=True) if not f]
        dropped += int(np.sum(flagged))
        if strategy == "sample" and len(keep) > num_negatives:
            keep = [keep[i] for i in sorted(rng.choice(len(keep), num_negatives, replace=False).tolist())]
        out.append(keep[:num_negatives])
    return out, dropped


def write_negatives(path: str, query_ids: list[str], doc_ids: list[str], chosen: list[list[int]]) -> None:
    """`query_id \\t doc_id,doc_id,...` per query with at least one negative (atomically)."""
    with atomic_open(path, "w") as f:
        for qid, row in zip(query_ids, chosen, strict=True):
            if row:
                f.write(f"{qid}\t{','.join(doc_ids[j] for j in row)}\n")


def _dense_candidates(encoder, queries: list[str], corpus: list[str], positives, depth: int, mesh=None):
    """(ranked [Q, depth], scores, positive_scores [Q]) by the model's cosine."""
    import jax

    from samtone_jax.core.console_progress import Progress
    from samtone_jax.evaluation import search

    with Progress(len(queries), "encoding queries", process_index=jax.process_index()) as progress:
        q = encoder.encode_queries(queries, progress.update)
    with Progress(len(corpus), "encoding documents", process_index=jax.process_index()) as progress:
        d = encoder.encode_documents(corpus, progress.update)
    scores, ranked = search.exact_top_k(q, d, depth, mesh=mesh)
    gold = np.array([max(float(q[i] @ d[j]) for j in pos) for i, pos in enumerate(positives)], np.float32)
    return ranked, scores, gold


def _bm25_candidates(queries: list[str], corpus: list[str], positives, depth: int):
    """(ranked, scores, positive_scores) by BM25 (bm25s, English stopwords)."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
    tokens = bm25s.tokenize(queries, stopwords="en", show_progress=False, return_ids=False)
    ranked, scores = retriever.retrieve(
        bm25s.tokenize(queries, stopwords="en", show_progress=False),
        k=min(depth, len(corpus)),
        show_progress=False,
        n_threads=1,
    )
    gold = np.array(
        [max(retriever.get_scores(t)[list(pos)]) if t else 0.0 for t, pos in zip(tokens, positives, strict=True)],
        np.float32,
    )
    return np.asarray(ranked), np.asarray(scores, np.float32), gold


def mine(
    collection,
    out: str,
    *,
    encoder=None,
    num_negatives: int = 8,
    range_min: int = 0,
    range_max: int = 100,
    false_negatives: FalseNegativeFilter = FalseNegativeFilter(),
    strategy: str = "top",
    seed: int = 0,
    mesh=None,
) -> dict:
    """Mine negatives for every query of `collection` that has a positive; write `out` (TSV) and
    `out`.json (counts). `encoder`: a samtone_jax.inference.encoder.Encoder, or None for BM25."""
    query_ids = sorted(q for q in collection.queries if collection.qrels.get(q))
    doc_ids = sorted(collection.corpus)
    index = {d: i for i, d in enumerate(doc_ids)}
    positives = [{index[d] for d, r in collection.qrels[q].items() if r > 0 and d in index} for q in query_ids]
    keep = [i for i, p in enumerate(positives) if p]
    query_ids, positives = [query_ids[i] for i in keep], [positives[i] for i in keep]
    if not query_ids:
        raise BadValueError(f"{collection.name}: no query has a relevant document in the corpus; nothing to mine")
    queries, corpus = [collection.queries[q] for q in query_ids], [collection.corpus[d] for d in doc_ids]
    if encoder is None:
        ranked, scores, gold = _bm25_candidates(queries, corpus, positives, range_max)
    else:
        ranked, scores, gold = _dense_candidates(encoder, queries, corpus, positives, range_max, mesh)
    chosen, dropped = select_negatives(
        ranked,
        scores,
        positives,
        gold,
        num_negatives=num_negatives,
        range_min=range_min,
        range_max=range_max,
        false_negatives=false_negatives,
        strategy=strategy,
        seed=seed,
    )
    write_negatives(out, query_ids, doc_ids, chosen)
    counts = [len(c) for c in chosen]
    summary = {
        "queries": len(query_ids),
        "with_enough_negatives": sum(c >= num_negatives for c in counts),
        "without_enough_negatives": sum(c < num_negatives for c in counts),
        "without_any_negative": sum(c == 0 for c in counts),
        "mean_negatives": float(np.mean(counts)),
        "method": "bm25" if encoder is None else f"dense:{encoder.source}@{encoder.step}",
        "num_negatives": num_negatives,
        "range": [range_min, range_max],
        "false_negative_filter": false_negatives.describe(),
        "dropped_as_false_negatives": dropped,
        "strategy": strategy,
        "seed": seed,
    }
    write_atomic(out + ".json", json.dumps(summary, indent=2))
    return summary
