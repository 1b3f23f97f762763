"""MS MARCO passage ranking in its official files, and BEIR's format (zero-shot evaluation).

MS MARCO (DATA_DIR/msmarco_passage/):
  collection.tsv              pid \\t passage
  queries.{train,dev}.tsv     qid \\t query
  qrels.{train,dev}.tsv       MS MARCO 'qid \\t 0 \\t pid \\t rel' or TREC 'qid Q0 pid rel'
  negatives.{train}.tsv       optional hard negatives: 'qid \\t pid,pid,...'
  negatives.{train}.jsonl     or as JSON lines: {"qid": ..., "negatives": [pid, ...]}

BEIR (DATA_DIR/beir/<name>/): corpus.jsonl {_id, title, text}; queries.jsonl {_id, text};
qrels/<split>.tsv with a header line 'query-id corpus-id score'.
"""

from __future__ import annotations

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError
from samtone_jax.data.collection import RetrievalCollection
from samtone_jax.data.records import ReadStats, exists, read_jsonl, read_lines, read_tsv, unique_ids


def read_qrels(path: str, stats: ReadStats, skip_bad_records: bool = False, header: bool = False):
    """{qid: {doc id: relevance}} from 4-column qrels (TREC or MS MARCO) or 3-column BEIR rows."""

    def parse(line: str):
        fields = line.split()
        if len(fields) == 4:
            return fields[0], fields[2], int(fields[3])
        if len(fields) == 3:
            return fields[0], fields[1], int(fields[2])
        raise BadValueError(f"expected 'qid Q0 docid rel' or 'qid docid rel', got {len(fields)} fields")

    qrels: dict[str, dict[str, int]] = {}
    for qid, did, rel in read_lines(path, parse, stats, skip_bad_records, skip_first=header):
        qrels.setdefault(qid, {})[did] = rel
    if not qrels:
        raise BadValueError(f"{path} has no relevance judgements" + (" (a header line only?)" if header else ""))
    return qrels


def read_negatives(path: str, stats: ReadStats, skip_bad_records: bool = False) -> dict[str, list[str]]:
    """Hard negatives per query from 'qid \\t pid,pid,...' or JSON lines {"qid", "negatives"}."""
    if path.endswith((".jsonl", ".jsonl.gz")):
        rows = read_jsonl(path, stats, skip_bad_records, require=("qid", "negatives"))
        return {str(r["qid"]): [str(n) for n in r["negatives"]] for r in rows}
    rows = read_tsv(path, 2, stats, skip_bad_records)
    return {qid: [n for n in negatives.split(",") if n] for qid, negatives in rows}


def load_msmarco(
    directory: str, split: str, skip_bad_records: bool = False, name: str = "msmarco_passage"
) -> RetrievalCollection:
    stats = ReadStats()
    path = paths.join(directory, "collection.tsv")
    corpus = unique_ids(read_tsv(path, 2, stats, skip_bad_records, numbered=True), path, "document", stats)
    if not corpus:
        raise BadValueError(f"{path} has no documents")
    path = paths.join(directory, f"queries.{split}.tsv")
    queries = unique_ids(read_tsv(path, 2, stats, skip_bad_records, numbered=True), path, "query", stats)
    qrels = read_qrels(paths.join(directory, f"qrels.{split}.tsv"), stats, skip_bad_records)
    negatives = {}
    for file in (f"negatives.{split}.tsv", f"negatives.{split}.jsonl"):
        path = paths.join(directory, file)
        if exists(path):
            negatives = read_negatives(path, stats, skip_bad_records)
            missing = sum(n not in corpus for ns in negatives.values() for n in ns)
            stats["negatives_with_missing_document"] += missing
            negatives = {q: [n for n in ns if n in corpus] for q, ns in negatives.items()}
    return RetrievalCollection(name, queries, corpus, qrels, negatives, stats).drop_empty()


def load_beir(directory: str, split: str, skip_bad_records: bool = False, name: str = "beir") -> RetrievalCollection:
    """A BEIR dataset; a document's text is 'title text' as BEIR's own evaluation encodes it."""
    stats = ReadStats()

    def document(doc: dict) -> tuple[str, str]:
        title = (doc.get("title") or "").strip()
        return str(doc["_id"]), f"{title} {doc['text']}".strip() if title else doc["text"]

    path = paths.join(directory, "corpus.jsonl")
    docs = read_jsonl(path, stats, skip_bad_records, require=("_id", "text"), numbered=True)
    corpus = unique_ids(((line, document(doc)) for line, doc in docs), path, "document", stats)
    if not corpus:
        raise BadValueError(f"{path} has no documents")
    path = paths.join(directory, "queries.jsonl")
    rows = read_jsonl(path, stats, skip_bad_records, require=("_id", "text"), numbered=True)
    queries = unique_ids(((line, (str(q["_id"]), q["text"])) for line, q in rows), path, "query", stats)
    qrels = read_qrels(paths.join(directory, "qrels", f"{split}.tsv"), stats, skip_bad_records, header=True)
    return RetrievalCollection(name, queries, corpus, qrels, stats=stats).drop_empty()
