"""InputSpec: what every training example carries. One object is given to the task registration
(which columns a task's examples hold: tasks/registration.register) and to the pipeline (which
features it batches: data/pipeline.train_dataset), so the two agree by construction."""

from __future__ import annotations

import dataclasses

from samtone_jax.core.errors import BadValueError
from samtone_jax.data.false_negatives import FalseNegativeFilter


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """vocabulary: the SentencePiece model (local or gs://; None: T5's public one). query_length /
    doc_length: tokens a text keeps (EOS included). num_negatives K: hard negatives an example
    carries (queries with fewer are dropped). From the task's `samtone score` file
    (hard_negatives_file.path): `teacher_scores` adds teacher_scores [1 + K] (the pair's positive,
    then its K negatives); `guide` (a FalseNegativeFilter) adds guide_ids [guide.max_ids], the text
    ids of the query's scored documents it flags, highest score first, padded with the pair's own
    doc_id. `negatives_fallback`: a query with fewer than K hard negatives is kept, its missing ones
    padded with its own positive (which the loss removes from every row: in-batch negatives only for
    it), instead of dropped."""

    vocabulary: str | None = None
    query_length: int = 64
    doc_length: int = 128
    num_negatives: int = 0
    teacher_scores: bool = False
    guide: FalseNegativeFilter | None = None
    negatives_fallback: bool = False

    def __post_init__(self):
        if self.query_length < 2 or self.doc_length < 2:
            raise BadValueError(
                f"train.query_length = {self.query_length} and train.doc_length = {self.doc_length} must be ≥ 2 "
                "(a token and EOS)"
            )
        if self.num_negatives < 0:
            raise BadValueError(f"inputs.num_negatives = {self.num_negatives}: must be ≥ 0")
        if self.negatives_fallback and (not self.num_negatives or self.teacher_scores):
            raise BadValueError(
                "inputs.negatives_fallback pads the hard negatives of a query that has fewer than "
                "inputs.num_negatives: it needs inputs.num_negatives > 0, and no inputs.teacher_scores (a padded "
                "slot has no teacher score of a negative)"
            )

    @property
    def guide_ids(self) -> int:
        """G, the width of guide_ids (0: no guide)."""
        return 0 if self.guide is None else self.guide.max_ids

    @property
    def has_teacher(self) -> bool:
        return self.teacher_scores or self.guide is not None

    @property
    def columns(self) -> tuple:
        """What decides a task's example columns (not the vocabulary or the lengths): a cache key."""
        return self.num_negatives, self.teacher_scores, self.guide, self.negatives_fallback
