"""The SamToNe paper's embedding-space measurements (Moiseev et al. 2023, Figures 1, 5 and 6).

Pure NumPy / scikit-learn, no plotting (that is `figures.py`):

  Figure 5  `top1_cosine`       cosine of each query with its top-1 retrieved document;
  Figure 6  `similarity_ratio`  sim(q_i, q_j) / sim(q_i, p_j) over random pairs i != j, p_j the
                                gold document of query j;
  Figure 1  `tsne`              a joint 2-D t-SNE of query and document embeddings.

Every embedding is a float32 row, L2-normalised, so cosine = inner product.
"""

from __future__ import annotations

import numpy as np

from samtone_jax.core.errors import BadValueError
from samtone_jax.evaluation import search

# A ratio's denominator smaller than this in magnitude makes it meaningless (and unbounded):
# such pairs are dropped, and counted by `summarize`.
RATIO_EPSILON = 1e-6


def top1_cosine(queries: np.ndarray, corpus: np.ndarray) -> np.ndarray:
    """Figure 5: [Q] float32 cosine of each query with its top-1 document.

    queries: [Q, D] float32, L2-normalised; corpus: [N, D] float32, L2-normalised, N >= 1.
    """
    if len(corpus) == 0:
        raise BadValueError("top1_cosine: the corpus has no rows; nothing to retrieve")
    if len(queries) == 0:
        return np.zeros((0,), np.float32)
    scores, _ = search.exact_top_k(queries, corpus, k=1)
    return scores[:, 0]


def sample_pairs(b: int, num_pairs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(i [num_pairs], j [num_pairs]) int64 row indices in [0, b), i != j, uniform over ordered pairs.

    Drawn with np.random.default_rng(seed): j comes from the b-1 rows other than i, so there is no
    rejection loop and the result depends only on (b, num_pairs, seed).
    """
    if b < 2:
        raise BadValueError(f"similarity ratio needs at least 2 (query, document) pairs to draw i != j, got {b}")
    rng = np.random.default_rng(seed)
    i = rng.integers(0, b, size=num_pairs)
    j = rng.integers(0, b - 1, size=num_pairs)
    return i, j + (j >= i)


def similarity_ratio_for_pairs(
    queries: np.ndarray, documents: np.ndarray, i: np.ndarray, j: np.ndarray, epsilon: float = RATIO_EPSILON
) -> tuple[np.ndarray, np.ndarray]:
    """(ratios [M] float64, kept [len(i)] bool): sim(q_i, q_j) / sim(q_i, p_j) for the given pairs.

    queries, documents: [B, D], row r of `documents` the gold document of query r. Pairs whose
    denominator has |sim(q_i, p_j)| < epsilon are dropped (kept False); M = kept.sum().
    """
    q = np.asarray(queries, np.float64)
    d = np.asarray(documents, np.float64)
    same = np.einsum("nd,nd->n", q[i], q[j])
    cross = np.einsum("nd,nd->n", q[i], d[j])
    kept = np.abs(cross) >= epsilon
    return same[kept] / cross[kept], kept


def similarity_ratio(queries: np.ndarray, documents: np.ndarray, num_pairs: int, seed: int) -> np.ndarray:
    """Figure 6: [M <= num_pairs] float64 ratios sim(q_i, q_j) / sim(q_i, p_j), i != j at random.

    queries, documents: [B, D] float32, L2-normalised, paired row-wise (document r is the gold
    document of query r), B >= 2. Pairs come from `sample_pairs(B, num_pairs, seed)`; a pair with
    |sim(q_i, p_j)| < RATIO_EPSILON is dropped (num_pairs - M of them), since dividing by ~0 says
    nothing about the geometry and would dominate any mean.
    """
    if queries.shape != documents.shape:
        raise BadValueError(f"similarity_ratio: queries {queries.shape} and documents {documents.shape} must be paired")
    i, j = sample_pairs(len(queries), num_pairs, seed)
    ratios, _ = similarity_ratio_for_pairs(queries, documents, i, j)
    return ratios


def tsne(
    queries: np.ndarray, documents: np.ndarray, seed: int, perplexity: float = 30.0
) -> tuple[np.ndarray, np.ndarray]:
    """Figure 1: (coords_q [n, 2], coords_d [n, 2]) float32 of one joint t-SNE of both towers.

    queries: [n, D], documents: [m, D] (usually the n gold documents). Fitting both sets together
    is what makes their overlap visible: separate fits would each centre their own cloud.
    PCA initialisation and a fixed random_state make the layout reproducible.
    """
    from sklearn.manifold import TSNE

    points = np.concatenate([np.asarray(queries, np.float32), np.asarray(documents, np.float32)])
    if not 0 < perplexity < len(points):
        raise BadValueError(f"tsne: perplexity={perplexity} must be in (0, {len(points)}) (the number of points)")
    coords = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(points)
    coords = coords.astype(np.float32)
    return coords[: len(queries)], coords[len(queries) :]


def default_perplexity(num_points: int) -> float:
    """sklearn's default 30, lowered for small samples to stay below the number of points."""
    return float(min(30.0, max(1.0, (num_points - 1) / 3)))


def summarize(
    top1: np.ndarray, ratios: np.ndarray, gold_cosine: np.ndarray, *, ratio_pairs_requested: int
) -> dict[str, float | int | None]:
    """The numbers behind Figures 5 and 6 for one model, JSON-ready.

    top1: [Q] (Figure 5); ratios: [M] (Figure 6, after dropping); gold_cosine: [B] cosine of each
    query with its own gold document (how close the positives are, for context). A statistic of
    an empty array is None (JSON null, where NaN would not be valid JSON).
    """

    def stat(fn, x):
        return float(fn(x)) if len(x) else None

    return {
        "top1_cosine_median": stat(np.median, top1),
        "top1_cosine_mean": stat(np.mean, top1),
        "similarity_ratio_median": stat(np.median, ratios),
        "similarity_ratio_mean": stat(np.mean, ratios),
        "gold_cosine_median": stat(np.median, gold_cosine),
        "gold_cosine_mean": stat(np.mean, gold_cosine),
        "num_queries": int(len(top1)),
        "num_gold_pairs": int(len(gold_cosine)),
        "num_ratio_pairs": int(len(ratios)),
        "num_ratio_pairs_dropped": int(ratio_pairs_requested - len(ratios)),
    }
