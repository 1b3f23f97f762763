"""The teacher-scores file: `samtone score`'s output, read back by the tasks for distillation.

JSON lines, one per training query:

  {"qid": "q1", "negatives": ["d7", "d3"], "scores": [11.2, 9.8], "positives": {"d1": 12.5}}

`negatives` are the query's candidates (the teacher's own top-K without the query's relevant
documents, or the mined negatives it was given), `scores` the teacher's score of each, and
`positives` the teacher's score of each relevant document. A file with `qid` and `negatives` is a
hard-negatives file (data/msmarco.read_negatives reads the same rows), so one gin name,
`hard_negatives_file.path`, attaches it: the negatives become the task's hard negatives and the
scores its `teacher_scores` (inputs.teacher_scores) and guide ids (inputs.teacher_guide).
"""

from __future__ import annotations

import json
import math

from samtone_jax.core.errors import BadValueError
from samtone_jax.data.records import ReadStats, json_object, read_lines


def row(qid: str, positives: dict[str, float], negatives: list[str], scores: list[float]) -> str:
    """One line of the file (no newline)."""
    return json.dumps(
        {
            "qid": qid,
            "negatives": negatives,
            "scores": [float(s) for s in scores],
            "positives": {d: float(s) for d, s in positives.items()},
        },
        ensure_ascii=False,
    )


def _parse(record: dict) -> tuple[str, list[str], dict[str, float]]:
    negatives = [str(n) for n in record["negatives"]]
    scored: dict[str, float] = {}
    if "scores" in record:
        scores = record["scores"]
        if not isinstance(scores, list) or len(scores) != len(negatives):
            raise BadValueError(f"'scores' must be a list as long as 'negatives' ({len(negatives)}); got {scores!r}")
        positives = record.get("positives", {})
        if not isinstance(positives, dict):
            raise BadValueError(f"'positives' must map document ids to scores; got {positives!r}")
        for did, score in [*zip(negatives, scores, strict=True), *positives.items()]:
            if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
                raise BadValueError(f"score of document {did!r} must be a finite number; got {score!r}")
            scored[str(did)] = float(score)
    return str(record["qid"]), negatives, scored


def read(path: str, stats: ReadStats, skip_bad_records: bool = False):
    """(negatives {qid: [doc id]}, scores {qid: {doc id: teacher score}}) of a negatives file;
    scores is empty for a file without them (a TSV from `samtone mine`, or JSON lines without
    `scores`)."""
    if not path.endswith((".jsonl", ".jsonl.gz")):
        from samtone_jax.data.msmarco import read_negatives

        return read_negatives(path, stats, skip_bad_records), {}
    negatives, scores = {}, {}

    def parse(line: str):
        return _parse(json_object(line, require=("qid", "negatives")))

    for qid, row_negatives, scored in read_lines(path, parse, stats, skip_bad_records):
        negatives[qid] = row_negatives
        if scored:
            scores[qid] = scored
    return negatives, scores
