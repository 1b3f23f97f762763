"""Teacher-guided negatives: which candidates a teacher scores too close to the positive to be negatives.

A candidate document c of a query with positive score t_p (the teacher's score of the query's
labelled document) is a likely false negative, an unlabelled relevant document, when any cut set
says so:

  margin m           t_c > t_p − m       (m = 0: scored above the positive, GISTEmbed's rule;
                                          m > 0 also removes those within m of it)
  relative_margin r  t_c > (1 − r) · t_p  (for scores on a ratio scale: BM25, cosine > 0)
  max_score M        t_c > M             (an absolute cut: a near-duplicate's cosine)

The same filter serves `samtone mine` (flagged candidates are not written as negatives; t_p is
the score of the query's best-scored relevant document) and training (t_p is each pair's own
positive; gin `inputs.teacher_guide = @FalseNegativeFilter()`: each pair's flagged documents become
its `guide_ids`, which contrastive_loss removes from every term, in-batch and same-tower
included). A filter with no cut set flags nothing (and training refuses it as a guide).
"""

from __future__ import annotations

import dataclasses

import gin
import numpy as np

from samtone_jax.core.errors import BadValueError


@gin.configurable
@dataclasses.dataclass(frozen=True)
class FalseNegativeFilter:
    """The cuts of the module docstring (None: that cut is off); `max_ids` G caps the guide ids a
    training pair carries (the highest-scoring G flagged documents; the rest are counted)."""

    margin: float | None = None
    relative_margin: float | None = None
    max_score: float | None = None
    max_ids: int = 16

    def __post_init__(self):
        if self.relative_margin is not None and not 0.0 <= self.relative_margin < 1.0:
            raise BadValueError(
                f"relative_margin (samtone mine --relative_margin, gin FalseNegativeFilter.relative_margin) must be in "
                f"[0, 1); got {self.relative_margin}"
            )
        if self.max_ids < 1:
            raise BadValueError(f"FalseNegativeFilter.max_ids must be >= 1; got {self.max_ids}")

    @property
    def active(self) -> bool:
        return (self.margin, self.relative_margin, self.max_score) != (None, None, None)

    def flags(self, scores, positive_score) -> np.ndarray:
        """bool [...]: which candidate scores (any shape; positive_score broadcast) are flagged."""
        scores = np.asarray(scores, np.float64)
        positive_score = np.asarray(positive_score, np.float64)
        out = np.zeros(scores.shape, bool)
        if self.margin is not None:
            out |= scores > positive_score - self.margin
        if self.relative_margin is not None:
            out |= scores > (1.0 - self.relative_margin) * positive_score
        if self.max_score is not None:
            out |= scores > self.max_score
        return out

    def describe(self) -> dict:
        return {"margin": self.margin, "relative_margin": self.relative_margin, "max_score": self.max_score}
