"""PNG figures of the embedding-space analysis, several models side by side (SamToNe Figures 1, 5, 6).

Built on `matplotlib.figure.Figure` directly, not pyplot: no global figure state and no GUI
backend, so it is safe in a headless job or a thread. Every PNG is written to a temporary file in
the target folder and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure

from samtone_jax.core.atomic_file import write_atomic
from samtone_jax.core.errors import BadValueError

QUERY_COLOR, DOCUMENT_COLOR = "tab:blue", "tab:orange"


def save_png(fig: Figure, path: str, dpi: int = 120) -> str:
    """Write `fig` to `path` as PNG, atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return write_atomic(path, buffer.getvalue())


def plot_tsne(data: dict[str, tuple[np.ndarray, np.ndarray]], path: str, num_links: int = 10) -> str:
    """Figure 1: one t-SNE panel per model, queries and documents in two colours.

    data: {model name: (coords_q [n, 2], coords_d [n, 2])}, row r of both one gold (q, d) pair;
    the first `num_links` pairs are joined by a grey line to show how far apart a pair lands.
    """
    if not data:
        raise BadValueError("plot_tsne: no models to draw")
    fig = Figure(figsize=(4.5 * len(data), 4.5))
    axes = fig.subplots(1, len(data), squeeze=False)[0]
    for ax, (name, (coords_q, coords_d)) in zip(axes, data.items(), strict=True):
        for r in range(min(num_links, len(coords_q), len(coords_d))):
            ax.plot([coords_q[r, 0], coords_d[r, 0]], [coords_q[r, 1], coords_d[r, 1]], color="0.4", lw=0.8, zorder=1)
        ax.scatter(coords_q[:, 0], coords_q[:, 1], s=8, alpha=0.7, color=QUERY_COLOR, label="queries", zorder=2)
        ax.scatter(coords_d[:, 0], coords_d[:, 1], s=8, alpha=0.7, color=DOCUMENT_COLOR, label="documents", zorder=2)
        ax.set_title(name)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0].legend(loc="best", fontsize="small")
    fig.suptitle("t-SNE of query and document embeddings (lines: gold pairs)")
    return save_png(fig, path)


def _histograms(data: dict[str, np.ndarray], path: str, xlabel: str, title: str, clip_percentile: float | None) -> str:
    """Overlaid, density-normalised histograms on shared bins, with each model's median dashed."""
    if not data:
        raise BadValueError(f"{title}: no models to draw")
    values = [np.asarray(v, np.float64) for v in data.values() if len(v)]
    pooled = np.concatenate(values) if values else np.zeros((1,))
    if clip_percentile is None:
        low, high = float(pooled.min()), float(pooled.max())
    else:
        # Ratios with a small denominator reach the thousands; shared bins over the full range
        # would squeeze the bulk of every distribution into one bar.
        low, high = np.percentile(pooled, [clip_percentile, 100 - clip_percentile])
        title = f"{title} ({clip_percentile:g}-{100 - clip_percentile:g} percentile range)"
    if high <= low:
        low, high = low - 0.5, high + 0.5
    bins = np.linspace(low, high, 51)
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    for k, (name, v) in enumerate(data.items()):
        color = f"C{k}"
        v = np.asarray(v, np.float64)
        ax.hist(np.clip(v, low, high), bins=bins, density=True, alpha=0.45, color=color, label=f"{name} (n={len(v)})")
        if len(v):
            ax.axvline(float(np.median(v)), color=color, ls="--", lw=1.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    return save_png(fig, path)


def plot_top1_cosine(data: dict[str, np.ndarray], path: str) -> str:
    """Figure 5: data {model name: [Q] cosine of each query with its top-1 document}."""
    return _histograms(data, path, "cosine(query, top-1 document)", "Top-1 retrieval cosine", None)


def plot_similarity_ratio(data: dict[str, np.ndarray], path: str, clip_percentile: float = 1.0) -> str:
    """Figure 6: data {model name: [M] ratios sim(q_i, q_j) / sim(q_i, p_j)}; values outside the
    pooled [clip_percentile, 100 - clip_percentile] range are piled into the edge bins."""
    return _histograms(
        data, path, "sim(q_i, q_j) / sim(q_i, p_j)", "Query-query over query-document similarity", clip_percentile
    )
