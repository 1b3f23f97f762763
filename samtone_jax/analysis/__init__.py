"""The SamToNe paper's embedding-space analysis (Figures 1, 5, 6): measurements, figures, a report.

embedding_space  top-1 cosine, similarity ratio, joint t-SNE, per-model summary (NumPy/sklearn)
figures          the PNGs, several models side by side (matplotlib, no GUI backend)
report           `analyze(encoders, collection, out_dir)`: all of it, written to a folder
"""

from samtone_jax.analysis.report import analyze

__all__ = ["analyze"]
