"""Encode texts with a dual encoder in fixed-size batches (one compilation, padded last batch)."""

from __future__ import annotations

import functools

import jax
import numpy as np

from samtone_jax.data.pipeline import encode_texts as tokenize


def encode_texts(model, params, vocabulary, texts: list[str], length: int, side: str, batch_size: int = 512):
    """[N, P] float32 L2-normalised embeddings of `texts` on the `side` ('query' | 'document') tower."""
    method = model.encode_queries if side == "query" else model.encode_documents
    apply = jax.jit(functools.partial(model.apply, method=method))
    out = []
    for start in range(0, len(texts), batch_size):
        tokens, _ = tokenize(vocabulary, texts[start : start + batch_size], length)
        n = len(tokens)
        if n < batch_size:  # pad to the compiled shape
            tokens = np.concatenate([tokens, np.zeros((batch_size - n, length), np.int32)])
        out.append(np.asarray(apply({"params": params}, tokens))[:n])
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)
