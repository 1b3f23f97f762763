"""Exact maximum-inner-product search on device, memory bounded by the chunk size.

The corpus is scored in chunks of `chunk_size` rows; each chunk's top-k merges with the running
top-k (`lax.top_k` over [k + chunk] candidates), so memory is O(queries × (k + chunk)), never
O(queries × corpus). Ties keep the lower corpus index (the merge puts earlier chunks first).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.partial(jax.jit, static_argnames=("k", "chunk_size"))
def _top_k(queries, corpus, k: int, chunk_size: int):
    n = corpus.shape[0]
    pad = (-n) % chunk_size
    corpus = jnp.pad(corpus, ((0, pad), (0, 0)))
    chunks = corpus.reshape(-1, chunk_size, corpus.shape[1])
    init = (jnp.full((queries.shape[0], k), -jnp.inf, jnp.float32), jnp.full((queries.shape[0], k), -1, jnp.int32))

    def merge(carry, x):
        best_scores, best_ids = carry
        chunk, start = x
        scores = jnp.einsum("qd,cd->qc", queries, chunk, preferred_element_type=jnp.float32)
        ids = start + jnp.arange(chunk_size, dtype=jnp.int32)
        scores = jnp.where(ids[None, :] < n, scores, -jnp.inf)  # padding rows never win
        all_scores = jnp.concatenate([best_scores, scores], axis=1)
        all_ids = jnp.concatenate([best_ids, jnp.broadcast_to(ids, scores.shape)], axis=1)
        top, where = jax.lax.top_k(all_scores, k)
        return (top, jnp.take_along_axis(all_ids, where, axis=1)), None

    starts = jnp.arange(chunks.shape[0], dtype=jnp.int32) * chunk_size
    (scores, ids), _ = jax.lax.scan(merge, init, (chunks, starts))
    return scores, ids


def exact_top_k(queries: np.ndarray, corpus: np.ndarray, k: int = 100, chunk_size: int = 8192, query_batch: int = 1024):
    """(scores [Q, k] float32, corpus indices [Q, k] int32), best first."""
    k = min(k, len(corpus))
    chunk_size = min(chunk_size, max(len(corpus), 1))
    out_scores, out_ids = [], []
    for start in range(0, len(queries), query_batch):
        s, i = _top_k(jnp.asarray(queries[start : start + query_batch]), jnp.asarray(corpus), k, chunk_size)
        out_scores.append(np.asarray(s))
        out_ids.append(np.asarray(i))
    return np.concatenate(out_scores), np.concatenate(out_ids)
