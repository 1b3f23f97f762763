"""`samtone score`: a teacher's scores of each training query's positives and K candidates.

For every query of the task's split with a relevant document in the corpus (sorted by id): the
candidates are the teacher's own top `depth` documents without the query's relevant ones
(`candidates='top'`) or the query's negatives in a given file (a `samtone mine` file, in its
order), and the teacher scores them and every relevant document. The result is the JSON-lines
file of data/teacher_scores.py, which training reads through `hard_negatives_file.path`.

Resumable: the queries are cut into shards of `shard_size`; each shard is written whole
(atomic_file) as OUT.parts/part-NNNNN.jsonl, and a rerun of the same command skips the shards
already there, so a killed job loses at most one shard and the final file is byte-identical to an
uninterrupted run's. OUT.parts/invocation.json records what the parts were made with; parts of a
different invocation are refused, not mixed. When every shard is there, OUT is written (atomically:
local rename, or one upload on gs://), then OUT.json (the counts), then the parts are removed.
"""

from __future__ import annotations

import json
import logging

import numpy as np

from samtone_jax.core import paths
from samtone_jax.core.atomic_file import atomic_open, write_atomic
from samtone_jax.core.errors import BadValueError
from samtone_jax.data import teacher_scores

log = logging.getLogger(__name__)


def _queries(collection):
    """(query ids, their relevant corpus indices) of every query with a relevant document, by id."""
    doc_ids, out = collection.relevant_indices()
    index = {d: i for i, d in enumerate(doc_ids)}
    if not out:
        raise BadValueError(f"{collection.name}: no query has a relevant document in the corpus; nothing to score")
    return doc_ids, index, out


def _shard_rows(teacher, collection, doc_ids, index, shard, candidates, depth) -> list[str]:
    """The file rows of one shard of (qid, relevant indices)."""
    texts = [collection.queries[q] for q, _ in shard]
    relevant = [r for _, r in shard]
    if candidates == "top":  # the top, and the relevant documents' scores, from one scoring pass
        widest = depth + max(len(r) for r in relevant)  # enough to drop the relevant ones
        ranked, ranked_scores, relevant_scores = teacher.rank(texts, widest, relevant)
        chosen, chosen_scores = [], []
        for row, row_scores, r in zip(ranked, ranked_scores, relevant, strict=True):
            kept = [(int(j), float(v)) for j, v in zip(row, row_scores, strict=True) if j not in set(r)][:depth]
            chosen.append([j for j, _ in kept])
            chosen_scores.append([v for _, v in kept])
    else:
        chosen = [[index[d] for d in candidates.get(q, []) if d in index and index[d] not in r] for q, r in shard]
        scores = teacher.score(texts, [r + c for r, c in zip(relevant, chosen, strict=True)])
        relevant_scores = [s[: len(r)] for s, r in zip(scores, relevant, strict=True)]
        chosen_scores = [s[len(r) :].tolist() for s, r in zip(scores, relevant, strict=True)]
    rows = []
    for (q, r), c, s_r, s_c in zip(shard, chosen, relevant_scores, chosen_scores, strict=True):
        positives = {doc_ids[j]: float(v) for j, v in zip(r, s_r, strict=True)}
        rows.append(teacher_scores.row(q, positives, [doc_ids[j] for j in c], s_c))
    return rows


def score(
    collection,
    out: str,
    teacher,
    *,
    candidates: str | dict[str, list[str]] = "top",
    depth: int = 32,
    shard_size: int = 1000,
    invocation: dict | None = None,
) -> dict:
    """Score `collection` with `teacher` (hard_negatives/teachers.py) into `out`; returns the counts
    (also in `out`.json). candidates: 'top' or {qid: [doc id]} (a negatives file, read); invocation:
    what identifies this command (task, split, teacher, candidates), recorded with the parts."""
    if depth < 1 or shard_size < 1:
        raise BadValueError(f"--depth ({depth}) and --shard_size ({shard_size}) must be >= 1")
    if candidates == "top" and not teacher.can_retrieve:
        raise BadValueError(
            f"--checkpoint={teacher.name} is a {teacher.kind}: it scores given pairs and cannot retrieve from the "
            "corpus; pass --candidates=FILE (a `samtone mine` negatives file)"
        )
    doc_ids, index, queries = _queries(collection)
    shards = [queries[i : i + shard_size] for i in range(0, len(queries), shard_size)]
    parts = paths.as_path(str(out) + ".parts")
    identity = dict(invocation or {}, depth=depth, shard_size=shard_size, queries=len(queries), teacher=teacher.name)
    identity["first_and_last_query"] = [queries[0][0], queries[-1][0]]
    recorded = parts / "invocation.json"
    if recorded.exists():
        before = json.loads(recorded.read_text())
        if before != identity:
            raise BadValueError(
                f"{parts} holds the parts of another invocation ({before}); this one is {identity}: rerun that "
                f"command to finish it, or delete {parts}"
            )
    else:
        write_atomic(recorded, json.dumps(identity, indent=2, sort_keys=True))
    names = [parts / f"part-{s:05d}.jsonl" for s in range(len(shards))]
    reused = [name.exists() for name in names]
    if any(reused):
        log.info("resuming: %d of %d shards already scored in %s", sum(reused), len(shards), parts)
    teacher.index([collection.corpus[d] for d in doc_ids])
    for name, shard, done in zip(names, shards, reused, strict=True):
        if not done:
            write_part(name, _shard_rows(teacher, collection, doc_ids, index, shard, candidates, depth))
    missing = 0 if candidates == "top" else sum(d not in index for q, _ in queries for d in candidates.get(q, []))
    with atomic_open(out, "w") as f:
        for name in names:
            f.write(name.read_text())
    counts = [len(json.loads(line)["negatives"]) for name in names for line in name.read_text().splitlines()]
    summary = {
        **{k: v for k, v in (invocation or {}).items() if k not in ("teacher", "candidates")},
        "queries": len(queries),
        "teacher": teacher.name,
        "teacher_kind": teacher.kind,
        "candidates": "top" if candidates == "top" else f"file:{(invocation or {}).get('candidates', '?')}",
        "depth": depth,
        "mean_candidates": float(np.mean(counts)),
        "queries_without_candidates": int(sum(c == 0 for c in counts)),
        "candidates_missing_from_corpus": missing,
        "shards": len(shards),
        "shards_reused": int(sum(reused)),
    }
    write_atomic(str(out) + ".json", json.dumps(summary, indent=2))
    parts.rmtree()
    return summary


def write_part(path, rows: list[str]) -> None:
    """One shard's rows, whole or not at all."""
    with atomic_open(path, "w") as f:
        f.write("".join(r + "\n" for r in rows))
