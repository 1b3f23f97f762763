"""A retrieval collection: queries, a corpus, relevance judgements, optional hard negatives and
teacher scores.

Every reader (MultiReQA, MS MARCO, BEIR, WordNet) produces one of these; the seqio tasks turn
it into training pairs (one example per relevant (query, document) pair) and evaluation
features (the corpus and the queries, with their ids).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from samtone_jax.core.errors import BadValueError
from samtone_jax.data.records import ReadStats


def normalize_text(text: str) -> str:
    """Lower-case, collapse whitespace: what counts as 'the same text' for duplicate ids."""
    return re.sub(r"\s+", " ", text).strip().lower()


def text_id(text: str) -> int:
    """A stable signed int64 id of the normalised text (BLAKE2b, 8 bytes), equal for duplicates."""
    digest = hashlib.blake2b(normalize_text(text).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


@dataclasses.dataclass
class RetrievalCollection:
    name: str
    queries: dict[str, str]  # query id -> text
    corpus: dict[str, str]  # document id -> text
    qrels: dict[str, dict[str, int]]  # query id -> {document id: relevance}
    hard_negatives: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    stats: ReadStats = dataclasses.field(default_factory=ReadStats)
    # query id -> {document id: a teacher's score} (data/teacher_scores.py; `samtone score`)
    teacher_scores: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    def pairs(self) -> list[tuple[str, str]]:
        """Every (query id, document id) with relevance > 0 whose texts exist, in a stable order
        (judgements pointing at a missing query or document are counted by `check`, not used)."""
        out = []
        for qid in sorted(self.qrels):
            if qid not in self.queries:
                continue
            for did, relevance in sorted(self.qrels[qid].items()):
                if relevance > 0 and did in self.corpus:
                    out.append((qid, did))
        return out

    def check(self, what: str) -> None:
        """ValueError for a collection nothing can be trained or scored on (no documents, no queries,
        no judgement of an existing pair); judgements that point at an unknown query or document
        are counted in `stats` (reported as a warning), never scored."""
        if not self.corpus:
            raise BadValueError(f"{what}: the corpus has no documents (after dropping empty texts); check its files")
        if not self.queries:
            raise BadValueError(f"{what}: there are no queries (after dropping empty texts); check its files")
        self.stats["qrels_with_missing_query"] = sum(len(r) for q, r in self.qrels.items() if q not in self.queries)
        self.stats["qrels_with_missing_document"] = sum(
            d not in self.corpus for q, r in self.qrels.items() if q in self.queries for d in r
        )
        if not self.pairs():
            raise BadValueError(
                f"{what}: no relevance judgement links an existing query to an existing document "
                f"({sum(len(r) for r in self.qrels.values())} judgements read; "
                f"{self.stats['qrels_with_missing_document']} point at unknown documents)"
            )

    def sample(self, max_queries: int | None = None, candidates: int | None = None) -> RetrievalCollection:
        """A smaller evaluation of the same kind, fixed by the data alone: at most `max_queries`
        judged queries (evenly spaced by id) ranked among at most `candidates` documents (every
        sampled query's relevant documents, then an even sample of the others by id). None or 0:
        all of them."""
        if (max_queries is not None and max_queries < 0) or (candidates is not None and candidates < 0):
            raise BadValueError(f"max_queries ({max_queries}) and candidates ({candidates}) must be ≥ 0")
        query_ids = sorted(q for q in self.queries if any(r > 0 for r in self.qrels.get(q, {}).values()))
        if max_queries and len(query_ids) > max_queries:
            query_ids = query_ids[:: len(query_ids) // max_queries][:max_queries]
        doc_ids = sorted(self.corpus)
        if candidates and candidates < len(doc_ids):
            gold = {d for q in query_ids for d, r in self.qrels[q].items() if r > 0 and d in self.corpus}
            others = [d for d in doc_ids if d not in gold]
            room = max(0, candidates - len(gold))
            spread = (others[i * len(others) // room] for i in range(room))  # evenly over the whole id range
            doc_ids = sorted(gold | set(spread))
        return dataclasses.replace(
            self,
            queries={q: self.queries[q] for q in query_ids},
            corpus={d: self.corpus[d] for d in doc_ids},
            qrels={q: self.qrels[q] for q in query_ids},
        )

    def relevant_indices(self) -> tuple[list[str], list[tuple[str, list[int]]]]:
        """(the corpus's document ids, sorted; (query id, the sorted indices of its relevant
        documents in that list) for every query, by id, with a relevant document in the corpus)."""
        doc_ids = sorted(self.corpus)
        index = {d: i for i, d in enumerate(doc_ids)}
        out = []
        for q in sorted(self.queries):
            relevant = sorted(index[d] for d, r in self.qrels.get(q, {}).items() if r > 0 and d in index)
            if relevant:
                out.append((q, relevant))
        return doc_ids, out

    def texts(self) -> list[str]:
        """Every query then every document text, in id order: a stable input for a vocabulary."""
        return [self.queries[k] for k in sorted(self.queries)] + [self.corpus[k] for k in sorted(self.corpus)]

    def drop_empty(self) -> RetrievalCollection:
        """Remove empty query and document texts, counting them."""
        for table, what in ((self.queries, "empty_queries"), (self.corpus, "empty_documents")):
            empty = [k for k, v in table.items() if not v or not v.strip()]
            for k in empty:
                del table[k]
            self.stats[what] += len(empty)
        return self

    def restrict_queries(self, keep) -> RetrievalCollection:
        """A collection with only the queries for which keep(qid) is true (corpus unchanged)."""
        queries = {q: t for q, t in self.queries.items() if keep(q)}
        return dataclasses.replace(
            self,
            queries=queries,
            qrels={q: r for q, r in self.qrels.items() if q in queries},
            hard_negatives={q: n for q, n in self.hard_negatives.items() if q in queries},
            teacher_scores={q: t for q, t in self.teacher_scores.items() if q in queries},
        )
