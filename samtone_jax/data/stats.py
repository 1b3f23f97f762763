"""`samtone data-stats`: how many examples a task has, how many are duplicates, how many truncate.

The SamToNe paper's stated limitation is duplicate documents (TriviaQA: 17 % unique); these
numbers tell whether a task needs id masking for document-side same-tower negatives.
"""

from __future__ import annotations

from samtone_jax.data.collection import RetrievalCollection, normalize_text


def collection_stats(collection: RetrievalCollection, vocab_path: str | None, query_length: int, doc_length: int):
    pairs = collection.pairs()
    queries = [collection.queries[q] for q, _ in pairs]
    documents = [collection.corpus[d] for _, d in pairs]
    unique_queries = len({normalize_text(t) for t in queries})
    unique_documents = len({normalize_text(t) for t in documents})
    out = {
        "examples": len(pairs),
        "queries": len(collection.queries),
        "corpus": len(collection.corpus),
        "unique_queries": unique_queries,
        "unique_documents": unique_documents,
        "unique_query_fraction": round(unique_queries / max(len(pairs), 1), 4),
        "unique_document_fraction": round(unique_documents / max(len(pairs), 1), 4),
        "problems": {k: v for k, v in collection.stats.items() if v},
    }
    if vocab_path:
        from samtone_jax.data import vocab
        from samtone_jax.data.sentencepiece_tokens import tokenize_texts

        vocabulary = vocab.vocabulary(vocab_path)
        _, q_trunc = tokenize_texts(vocabulary, queries, query_length)
        _, d_trunc = tokenize_texts(vocabulary, documents, doc_length)
        out["query_truncation_rate"] = round(float(q_trunc.mean()) if len(q_trunc) else 0.0, 4)
        out["document_truncation_rate"] = round(float(d_trunc.mean()) if len(d_trunc) else 0.0, 4)
    return out
