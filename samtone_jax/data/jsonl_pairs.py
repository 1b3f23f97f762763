"""Your own training data as JSON lines: one relevant (query, document) pair a line, optionally with
ids, hard negatives (triplets and beyond) and a teacher's scores.

  {"query": "what is a cat", "document": "A small domesticated carnivore."}
  {"query": "...", "document": "...", "negatives": ["...", "..."]}     (or "negative": "..." for one)
  optional: "query_id", "document_id"  your ids (default: from the normalised text, so equal texts
                                       share an id and a document judged for two queries is one document)
            "negative_ids"             ids of "negatives", in order
  {"text": "..."}                      a text alone (no query): paired with itself, for label-free
                                       adaptation (a teacher's embeddings of your corpus:
                                       objectives/embedding_distillation.py); no other field
            "document_score", "negative_scores"   a teacher's scores of the document and of each
                                       negative (distillation: inputs.teacher_scores)

Several lines may share a query: each adds a relevant document (and its negatives). An id you give
twice with two different texts is an error naming both lines (never a silent overwrite), whichever
splits the lines fall in; texts that differ only in case or spacing share a made-up id (the first
spelling is kept). Local or
gs:// files, `.gz` too; a malformed line fails as `file:line: what` (or is skipped and counted with
skip_bad_records).

Splits: a file per split, or one file split by a stated rule: a query is in 'test' when the first
8 hex digits of md5(its normalised text), as a fraction of 16^8, fall below test_fraction, in 'dev'
when they fall in the next dev_fraction of the range, in 'train' otherwise; so all pairs of a query
land on one side, whatever the file's order, and adding lines never moves an existing query (nor
does adding a dev split move a test query).
"""

from __future__ import annotations

import hashlib
import math

from samtone_jax.core.errors import BadValueError
from samtone_jax.data.collection import RetrievalCollection, normalize_text, text_id
from samtone_jax.data.records import BadRecordError, ReadStats, json_object, read_lines

FIELDS = (
    "query",
    "document",
    "negative",
    "negatives",
    "query_id",
    "document_id",
    "negative_ids",
    "document_score",
    "negative_scores",
)


def split_of(query: str, test_fraction: float, dev_fraction: float = 0.0) -> str:
    """'test', 'dev' or 'train': the split rule of a one-file task (module docstring)."""
    position = int(hashlib.md5(normalize_text(query).encode("utf-8")).hexdigest()[:8], 16)
    if position < test_fraction * 16**8:
        return "test"
    return "dev" if position < (test_fraction + dev_fraction) * 16**8 else "train"


def in_test_split(query: str, test_fraction: float) -> bool:
    """Whether `query` is in a one-file task's 'test' split."""
    return split_of(query, test_fraction) == "test"


def _text(record: dict, key: str) -> str:
    value = record[key]
    if not isinstance(value, str):
        raise BadValueError(f"{key!r} must be a string, got {type(value).__name__}")
    return value


def _score(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _pair_of(record: dict) -> dict:
    """A "text" line as the pair (text, text); any other line as it is, with its query and document."""
    if "text" not in record:
        missing = [k for k in ("query", "document") if k not in record]
        if missing:
            raise KeyError(f"missing field(s) {missing} (or a text alone: 'text')")
        return record
    if set(record) != {"text"}:
        raise BadValueError(
            f"a 'text' line (a text alone, paired with itself) has no other field; got {sorted(record)}: give "
            "'query' and 'document' for a pair"
        )
    text = _text(record, "text")
    return {"query": text, "document": text}


def _parse(record: dict) -> dict:
    """One line's pair, checked: {query, document, negatives [text], ids, scores}."""
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise BadValueError(f"unknown field(s) {unknown}; known: {', '.join(FIELDS)}")
    if "negative" in record and "negatives" in record:
        raise BadValueError("give 'negative' (one text) or 'negatives' (a list), not both")
    negatives = record.get("negatives", [record["negative"]] if "negative" in record else [])
    if not isinstance(negatives, list) or not all(isinstance(n, str) for n in negatives):
        raise BadValueError(f"'negatives' must be a list of strings, got {negatives!r}")
    out = {"query": _text(record, "query"), "document": _text(record, "document"), "negatives": negatives}
    for key in ("query_id", "document_id"):
        if key in record and (not isinstance(record[key], (str, int)) or isinstance(record[key], bool)):
            raise BadValueError(f"{key!r} must be a string or an integer, got {record[key]!r}")
    out["query_id"] = str(record.get("query_id", f"q{text_id(out['query'])}"))
    out["document_id"] = str(record.get("document_id", f"d{text_id(out['document'])}"))
    ids = record.get("negative_ids")
    if ids is not None and (not isinstance(ids, list) or len(ids) != len(negatives)):
        raise BadValueError(f"'negative_ids' must be a list as long as the negatives ({len(negatives)}), got {ids!r}")
    out["negative_ids"] = [str(i) for i in ids] if ids is not None else [f"d{text_id(n)}" for n in negatives]
    scores = {}
    if "document_score" in record or "negative_scores" in record:
        given = record.get("negative_scores")
        if "document_score" not in record or not isinstance(given, list) or len(given) != len(negatives):
            raise BadValueError(
                f"a teacher's scores need 'document_score' and 'negative_scores' (a list as long as the "
                f"negatives, {len(negatives)}); got {record.get('document_score')!r} and {given!r}"
            )
        scores[out["document_id"]] = _score(record["document_score"], "'document_score'")
        for did, value in zip(out["negative_ids"], given, strict=True):
            scores[did] = _score(value, "each of 'negative_scores'")
    out["scores"] = scores
    out["given"] = {"query": "query_id" in record, "document": "document_id" in record, "negatives": ids is not None}
    return out


def load(path: str, name: str, keep=lambda query: True, skip_bad_records: bool = False) -> RetrievalCollection:
    """The collection of the pairs in `path` whose query text passes `keep` (a split rule). Ids are
    checked over every line, whichever split it is in: an id you gave with two different texts is
    an error naming both lines; an id made from the text holds the first spelling of it (texts that
    differ only in case or spacing are one text)."""
    stats = ReadStats()
    queries, corpus, qrels, negatives, scores = {}, {}, {}, {}, {}
    seen: dict[tuple[str, str], tuple[str, int]] = {}  # (kind, id) -> (its first text, that line)

    def check(kind: str, key: str, text: str, line: int, given: bool) -> None:
        first, first_line = seen.setdefault((kind, key), (text, line))
        if given and first != text:
            raise BadRecordError(
                f"{path}:{line}: {kind} id {key!r} has another text on line {first_line}: give each {kind} one "
                "id, or leave the ids out (then equal texts share one)"
            )

    def parse(line: str) -> dict:
        return _parse(_pair_of(json_object(line)))

    for line, pair in read_lines(path, parse, stats, skip_bad_records, numbered=True):
        if not pair["query"].strip() or not pair["document"].strip():
            stats["pairs_with_an_empty_text"] += 1
            continue
        qid, did, given = pair["query_id"], pair["document_id"], pair["given"]
        check("query", qid, pair["query"], line, given["query"])
        check("document", did, pair["document"], line, given["document"])
        kept = [(n, t) for n, t in zip(pair["negative_ids"], pair["negatives"], strict=True) if t.strip()]
        stats["empty_negatives"] += len(pair["negatives"]) - len(kept)
        for nid, text in kept:
            check("document", nid, text, line, given["negatives"])
        if not keep(pair["query"]):
            continue
        queries.setdefault(qid, pair["query"])
        corpus.setdefault(did, pair["document"])
        qrels.setdefault(qid, {})[did] = 1
        known = negatives.setdefault(qid, [])
        for nid, text in kept:
            corpus.setdefault(nid, text)
            if nid not in known:
                known.append(nid)
        if pair["scores"]:
            scores.setdefault(qid, {}).update(pair["scores"])
    for qid, ids in negatives.items():  # a document relevant to the query is not its negative
        negatives[qid] = [d for d in ids if d not in qrels[qid]]
    negatives = {q: ids for q, ids in negatives.items() if ids}
    return RetrievalCollection(name, queries, corpus, qrels, negatives, stats, teacher_scores=scores)
