"""Retrieval metrics during training: every `schedule.eval_every` steps, the current parameters
retrieve over a held-out split (`train_eval.retrieval_task` / `retrieval_eval_split`).

The collection is loaded and tokenised once (cached for the whole run); each evaluation encodes
the cached tokens on the training mesh with the live parameters (no checkpoint round trip, no
recompilation), searches exactly, and returns ir-measures metrics to log as `retrieval/<name>`.
`precisions` (gin RetrievalEval.precisions, e.g. ('int8', 'binary')) also scores the index those
embeddings make compressed (evaluation/compressed.py; int8 ranges from the evaluated documents),
rescored from the top k·`rescore` when rescore > 0: `retrieval/<precision>[_rescore<R>]/<name>`.
"""

from __future__ import annotations

import logging
import time

import gin

from samtone_jax.compression import quantization
from samtone_jax.core.errors import BadValueError
from samtone_jax.data.sentencepiece_tokens import tokenize_texts as tokenize
from samtone_jax.evaluation import compressed, metrics, search
from samtone_jax.inference.text_embedder import TextEmbedder

log = logging.getLogger(__name__)


@gin.configurable
class RetrievalEval:
    """Callable params -> {'retrieval/P@1': ..., 'retrieval/RR': ..., ...} on a fixed query sample."""

    def __init__(
        self,
        model,
        mesh,
        vocabulary,
        task: str,
        split: str,
        query_length: int,
        doc_length: int,
        max_queries: int | None = 2000,
        k: int = 100,
        batch_size: int = 256,
        precisions: tuple[str, ...] = (),
        rescore: int = 0,
        candidates: int | None = None,
        prefix: str = "retrieval",
    ):
        from samtone_jax.tasks import catalogue, prompts

        collection = catalogue.collection(task, split)
        if not collection.queries or not collection.corpus:
            raise BadValueError(f"{task!r} split {split!r} has no queries or no documents to evaluate on")
        collection = collection.sample(max_queries, candidates)  # an evenly spaced, fixed sample
        query_ids = sorted(collection.queries)
        self.query_ids, self.doc_ids = query_ids, sorted(collection.corpus)
        self.qrels = {q: collection.qrels[q] for q in query_ids}
        query_prompt, doc_prompt = prompts.prompt_of(task)  # as the run trains and samtone_jax.load serves
        queries = [query_prompt + collection.queries[q] for q in query_ids]
        # Trailing columns no text reaches are cut: padding changes no embedding, and a model served at
        # 256 tokens is not charged 256 for short texts.
        self.query_tokens = _trimmed(tokenize(vocabulary, queries, query_length)[0])
        documents = [doc_prompt + collection.corpus[d] for d in self.doc_ids]
        self.doc_tokens = _trimmed(tokenize(vocabulary, documents, doc_length)[0])
        self.prefix = prefix
        self.encoder = TextEmbedder(model, None, vocabulary, mesh, batch_size)
        self.k, self.name = min(k, len(self.doc_ids)), f"{task}/{split}"
        asked = (
            compressed.variants(precisions, rescore, ("RetrievalEval.precisions", "RetrievalEval.rescore"))
            if precisions or rescore
            else []
        )
        self.served = [(p, factor) for p, factor in asked if p != "float32"]  # float32: always scored above
        self.measures = metrics.measures_for_depth(self.k)
        log.info("retrieval eval on %s: %d queries, %d documents", self.name, len(query_ids), len(self.doc_ids))

    def __call__(self, params) -> dict[str, float]:
        start = time.time()
        q = self.encoder.encode_all(self.query_tokens, "query", params=params)
        d = self.encoder.encode_all(self.doc_tokens, "document", params=params)
        scores, indices = search.exact_top_k(q, d, self.k)
        run = metrics.run_from_top_k(self.query_ids, self.doc_ids, scores, indices)
        results = {f"{self.prefix}/{m}": v for m, v in metrics.evaluate(self.qrels, run, self.measures).items()}
        ranges = quantization.int8_ranges(d) if any(p == "int8" for p, _ in self.served) else None
        for precision, factor in self.served:
            found = compressed.compressed_top_k(q, d, precision, k=self.k, ranges=ranges, rescore_factor=factor)
            run = metrics.run_from_top_k(self.query_ids, self.doc_ids, found.ranking_scores(), found.indices)
            prefix = f"{self.prefix}/{precision}" + (f"_rescore{factor}" if factor else "")
            results |= {f"{prefix}/{m}": v for m, v in metrics.evaluate(self.qrels, run, self.measures).items()}
        results[f"{self.prefix}/seconds"] = time.time() - start
        return results


def _trimmed(tokens):
    """[N, L] ids without the trailing columns that are padding in every row (at least one column)."""
    import numpy as np

    used = np.flatnonzero((tokens != 0).any(axis=0))
    return tokens[:, : max(int(used[-1]) + 1 if used.size else 1, 1)]
