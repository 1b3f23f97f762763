"""A retrieval collection: queries, a corpus, relevance judgements, optional hard negatives.

Every reader (MultiReQA, MS MARCO, BEIR, WordNet) produces one of these; the seqio tasks turn
it into training pairs (one example per relevant (query, document) pair) and evaluation
features (the corpus and the queries, with their ids).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

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

    def pairs(self) -> list[tuple[str, str]]:
        """Every (query id, document id) with relevance > 0 whose texts exist, in a stable order.

        Judgements pointing at a missing query or document are counted in `stats`, not used.
        """
        out = []
        for qid in sorted(self.qrels):
            if qid not in self.queries:
                self.stats["qrels_with_missing_query"] += len(self.qrels[qid])
                continue
            for did, relevance in sorted(self.qrels[qid].items()):
                if relevance <= 0:
                    continue
                if did not in self.corpus:
                    self.stats["qrels_with_missing_document"] += 1
                    continue
                out.append((qid, did))
        return out

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
        )
