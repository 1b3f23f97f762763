"""`analyze`: the SamToNe embedding-space analysis of several models on one collection, to a folder.

Each model encodes the collection's queries (sorted by id) and whole corpus once; from those:
Figure 5 (top-1 cosine of every query), Figure 6 (similarity ratio over (query, first gold
document) pairs) and Figure 1 (joint t-SNE of a sample of those pairs, the same sample for every
model so the panels compare). Written to `out_dir`: tsne.png, top1_cosine.png,
similarity_ratio.png, distributions.npz (the arrays plotted), summary.json and report.md.
"""

from __future__ import annotations

import io
import json
from typing import Protocol

import numpy as np

from samtone_jax.analysis import embedding_space, figures
from samtone_jax.core import paths
from samtone_jax.core.atomic_file import write_atomic
from samtone_jax.core.errors import BadValueError
from samtone_jax.data.collection import RetrievalCollection

NUM_TSNE_LINKS = 10
NORM_TOLERANCE = 1e-3
STATISTICS = (  # the report table's columns, in order
    "top1_cosine_median",
    "top1_cosine_mean",
    "similarity_ratio_median",
    "similarity_ratio_mean",
    "gold_cosine_median",
)


class Encoder(Protocol):
    """What `analyze` needs of a model (e.g. `samtone_jax.inference.encoder.Encoder`)."""

    def encode_queries(self, texts: list[str]) -> np.ndarray: ...

    def encode_documents(self, texts: list[str]) -> np.ndarray: ...


def _checked(name: str, method: str, array, rows: int) -> np.ndarray:
    """[rows, D] float32 embeddings, or a ValueError naming the model and what is wrong."""
    x = np.asarray(array)
    if x.ndim != 2 or x.shape[0] != rows:
        raise BadValueError(f"model {name!r}: {method} returned shape {x.shape}, expected [{rows}, D]")
    x = x.astype(np.float32)
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        raise BadValueError(
            f"model {name!r}: {method} returned non-finite values (NaN/inf) in {int((~finite).sum())} of {rows} rows "
            f"(first at row {int(np.argmin(finite))}); check the checkpoint and the encoder's dtype"
        )
    off = np.abs(np.linalg.norm(x, axis=1) - 1.0) > NORM_TOLERANCE
    if off.any():
        raise BadValueError(
            f"model {name!r}: {method} returned {int(off.sum())} of {rows} rows that are not L2-normalised "
            f"(first at row {int(np.argmax(off))}); encoders must return unit rows (an empty text gives a zero row: "
            "call collection.drop_empty() first)"
        )
    return x


def analyze(
    encoders: dict[str, Encoder],
    collection: RetrievalCollection,
    out_dir: str,
    *,
    tsne_sample: int = 500,
    ratio_pairs: int = 10000,
    seed: int = 0,
    max_queries: int | None = None,
) -> dict:
    """Run the analysis for every model; write the figures and report; return the summary.

    encoders: {model name: Encoder}, each returning [N, D] float32 L2-normalised rows.
    Returns {"parameters": {...}, "models": {name: embedding_space.summarize(...) + embedding_dim}}
    (also written to out_dir/summary.json).
    """
    if not encoders:
        raise BadValueError("analyze: no encoders given (pass {model name: encoder})")
    if tsne_sample < 2 or ratio_pairs < 1 or (max_queries is not None and max_queries < 1):
        raise BadValueError(
            f"analyze: need tsne_sample >= 2, ratio_pairs >= 1 and max_queries None or >= 1; got tsne_sample="
            f"{tsne_sample}, ratio_pairs={ratio_pairs}, max_queries={max_queries}"
        )
    query_ids = sorted(collection.queries)[:max_queries]
    doc_ids = sorted(collection.corpus)
    if not query_ids or not doc_ids:
        raise BadValueError(
            f"analyze: collection {collection.name!r} is empty ({len(query_ids)} queries, {len(doc_ids)} documents "
            f"with max_queries={max_queries}); nothing to analyse"
        )
    # The first gold document (by id) of each selected query: one pair per query, so no query
    # with many golds (MultiReQA) weighs more in Figures 1 and 6.
    query_row = {q: r for r, q in enumerate(query_ids)}
    doc_row = {d: r for r, d in enumerate(doc_ids)}
    gold: dict[str, str] = {}
    for qid, did in collection.pairs():
        if qid in query_row:
            gold.setdefault(qid, did)
    gold_q = np.array([query_row[q] for q in gold], np.int64)
    gold_d = np.array([doc_row[d] for d in gold.values()], np.int64)
    if len(gold_q) < 2:
        raise BadValueError(
            f"analyze: collection {collection.name!r} has {len(gold_q)} selected queries with a gold document in the "
            "corpus; Figures 1 and 6 need at least 2 (check qrels and max_queries)"
        )
    sample = np.sort(np.random.default_rng(seed).choice(len(gold_q), size=min(tsne_sample, len(gold_q)), replace=False))
    perplexity = embedding_space.default_perplexity(2 * len(sample))
    query_texts = [collection.queries[q] for q in query_ids]
    doc_texts = [collection.corpus[d] for d in doc_ids]

    models, top1s, ratios, coords, arrays = {}, {}, {}, {}, {}
    for name, encoder in encoders.items():
        q = _checked(name, "encode_queries", encoder.encode_queries(query_texts), len(query_texts))
        c = _checked(name, "encode_documents", encoder.encode_documents(doc_texts), len(doc_texts))
        if q.shape[1] != c.shape[1]:
            raise BadValueError(
                f"model {name!r}: query embeddings are {q.shape[1]}-d but document embeddings {c.shape[1]}-d; "
                "both towers must project to the same dimension"
            )
        pq, pd = q[gold_q], c[gold_d]
        top1s[name] = embedding_space.top1_cosine(q, c)
        ratios[name] = embedding_space.similarity_ratio(pq, pd, ratio_pairs, seed)
        coords[name] = embedding_space.tsne(pq[sample], pd[sample], seed, perplexity)
        gold_cosine = np.einsum("nd,nd->n", pq.astype(np.float64), pd.astype(np.float64))
        models[name] = embedding_space.summarize(
            top1s[name], ratios[name], gold_cosine, ratio_pairs_requested=ratio_pairs
        ) | {"embedding_dim": int(q.shape[1])}
        arrays |= {f"{name}/top1_cosine": top1s[name], f"{name}/similarity_ratio": ratios[name]}
        arrays |= {f"{name}/tsne_queries": coords[name][0], f"{name}/tsne_documents": coords[name][1]}

    summary = {
        "parameters": {
            "collection": collection.name,
            "num_queries": len(query_ids),
            "num_documents": len(doc_ids),
            "max_queries": max_queries,
            "tsne_sample": int(len(sample)),
            "tsne_perplexity": perplexity,
            "ratio_pairs": ratio_pairs,
            "ratio_epsilon": embedding_space.RATIO_EPSILON,
            "seed": seed,
        },
        "models": models,
    }
    out = paths.as_path(out_dir)
    figures.plot_tsne(coords, out / "tsne.png", num_links=NUM_TSNE_LINKS)
    figures.plot_top1_cosine(top1s, out / "top1_cosine.png")
    figures.plot_similarity_ratio(ratios, out / "similarity_ratio.png")
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_atomic(out / "distributions.npz", buffer.getvalue())
    summary_json = json.dumps(summary, indent=2) + "\n"
    write_atomic(out / "summary.json", summary_json.encode("utf-8"))
    write_atomic(out / "report.md", _markdown(summary).encode("utf-8"))
    return summary


def _markdown(summary: dict) -> str:
    p = summary["parameters"]
    lines = [
        f"# Embedding-space analysis: {p['collection']}",
        "",
        f"{p['num_queries']} queries against {p['num_documents']} documents; {p['ratio_pairs']} random pairs for "
        f"the similarity ratio, {p['tsne_sample']} gold pairs for t-SNE (perplexity {p['tsne_perplexity']:g}), "
        f"seed {p['seed']}.",
        "",
        "| model | dim | top-1 cosine median | top-1 cosine mean | ratio median | ratio mean | gold cosine median "
        "| ratio pairs (dropped) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in summary["models"].items():
        cells = [f"{m[k]:.4f}" if m[k] is not None else "n/a" for k in STATISTICS]
        lines.append(
            f"| {name} | {m['embedding_dim']} | {' | '.join(cells)} "
            f"| {m['num_ratio_pairs']} ({m['num_ratio_pairs_dropped']}) |"
        )
    lines += [
        "",
        "![t-SNE of query and document embeddings](tsne.png)",
        "",
        f"*Figure 1 (t-SNE): queries (blue) and documents (orange) of the same {p['tsne_sample']} gold pairs in one "
        f"joint t-SNE per model, lines joining {NUM_TSNE_LINKS} gold pairs; in the paper, SamToNe makes the query and "
        "document embedding spaces overlap more.*",
        "",
        "![Top-1 retrieval cosine](top1_cosine.png)",
        "",
        "*Figure 5: distribution of the cosine between each query and its top-1 retrieved document "
        "(dashed lines: medians).*",
        "",
        "![Similarity ratio](similarity_ratio.png)",
        "",
        "*Figure 6: distribution of the similarity ratio sim(q_i, q_j) / sim(q_i, p_j) over random pairs i != j, "
        f"p_j the gold document of query j (pairs with |sim(q_i, p_j)| < {p['ratio_epsilon']:g} dropped; "
        "plotted over the 1-99th percentile range).*",
        "",
    ]
    return "\n".join(lines)
