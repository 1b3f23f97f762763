"""FAISS backends for CPU hosts: IndexFlatIP (exact) and IndexIVFPQ (approximate, compressed).

The flat index returns the same top-k as evaluation/search.py's exact search; its rows are
re-ordered by (score desc, corpus index asc) so that ties are broken the same way.
"""

from __future__ import annotations

import numpy as np

from samtone_jax.core.errors import BadValueError


def _import_faiss():
    try:
        import faiss
    except ImportError as e:
        raise ImportError("the faiss backends need faiss-cpu: pip install 'samtone_jax[faiss]'") from e
    return faiss


def faiss_top_k(
    queries: np.ndarray,
    corpus: np.ndarray,
    k: int = 100,
    index: str = "flat",
    nlist: int | None = None,
    nprobe: int = 16,
    pq_m: int | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(scores [Q, k] float32, corpus indices [Q, k] int64, -1 where fewer than k were found).

    queries [Q, D], corpus [N, D] float32. index 'flat' is exact; 'ivfpq' clusters the corpus into
    `nlist` cells (default ~4·sqrt(N)), searches `nprobe` of them, and stores `pq_m` sub-quantised
    bytes per vector (default D/4, rounded to a divisor of D).
    """
    faiss = _import_faiss()
    corpus = np.ascontiguousarray(corpus, np.float32)
    queries = np.ascontiguousarray(queries, np.float32)
    n, d = corpus.shape
    k = min(k, n)
    if index == "flat":
        search_index = faiss.IndexFlatIP(d)
    elif index == "ivfpq":
        nlist = nlist or max(1, min(int(4 * np.sqrt(n)), n // 39))  # faiss wants >= 39 points per centroid
        pq_m = pq_m or max(m for m in range(1, d // 4 + 1) if d % m == 0)
        if d % pq_m:
            raise BadValueError(f"pq_m={pq_m} must divide the embedding dimension {d}")
        search_index = faiss.IndexIVFPQ(faiss.IndexFlatIP(d), d, nlist, pq_m, 8, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(seed).permutation(n)[: max(nlist * 256, 10000)]
        search_index.train(corpus[np.sort(sample)])
        search_index.nprobe = nprobe
    else:
        raise BadValueError(f"unknown faiss index {index!r}; choose 'flat' or 'ivfpq'")
    search_index.add(corpus)
    scores, ids = search_index.search(queries, k)
    if index == "flat":  # ties by lower index, as the on-device search
        order = np.lexsort((ids, -scores))  # per row: score descending, then index ascending
        scores, ids = np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
    return scores, ids
