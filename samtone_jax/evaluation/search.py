"""Exact maximum-inner-product search on device, memory bounded by the chunk size.

The corpus is scored in chunks of `chunk_size` rows; each chunk's top-k merges with the running
top-k (`lax.top_k` over [k + chunk] candidates), so memory is O(queries × (k + chunk)), never
O(queries × corpus). With a mesh, the corpus is sharded over 'data': each device keeps the top-k
of its shard, the k·devices candidates are all-gathered and merged. Ties keep the lower corpus
index everywhere (lax.top_k is stable and earlier chunks / devices hold lower ids).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def _chunked_top_k(queries, corpus, k: int, chunk_size: int, n: int, offset=0):
    """Top-k over `corpus` rows (global ids offset + row; rows with id >= n are padding)."""
    chunks = corpus.reshape(-1, chunk_size, corpus.shape[1])
    init = (jnp.full((queries.shape[0], k), -jnp.inf, jnp.float32), jnp.full((queries.shape[0], k), -1, jnp.int32))

    def merge(carry, x):
        best_scores, best_ids = carry
        chunk, start = x
        scores = jnp.einsum("qd,cd->qc", queries, chunk, preferred_element_type=jnp.float32)
        ids = offset + start + jnp.arange(chunk_size, dtype=jnp.int32)
        scores = jnp.where(ids[None, :] < n, scores, -jnp.inf)  # padding rows never win
        all_scores = jnp.concatenate([best_scores, scores], axis=1)
        all_ids = jnp.concatenate([best_ids, jnp.broadcast_to(ids, scores.shape)], axis=1)
        top, where = jax.lax.top_k(all_scores, k)
        return (top, jnp.take_along_axis(all_ids, where, axis=1)), None

    starts = jnp.arange(chunks.shape[0], dtype=jnp.int32) * chunk_size
    (scores, ids), _ = jax.lax.scan(merge, init, (chunks, starts))
    return scores, ids


@functools.partial(jax.jit, static_argnames=("k", "chunk_size", "n"))
def _top_k(queries, corpus, k: int, chunk_size: int, n: int):
    return _chunked_top_k(queries, corpus, k, chunk_size, n)


@functools.partial(jax.jit, static_argnames=("k", "chunk_size", "n", "mesh"))
def _sharded_top_k(queries, corpus, k: int, chunk_size: int, n: int, mesh):
    rows = corpus.shape[0] // mesh.shape["data"]

    def local(q, shard):
        offset = jax.lax.axis_index("data") * rows
        scores, ids = _chunked_top_k(q, shard, k, chunk_size, n, offset)
        scores = jax.lax.all_gather(scores, "data", axis=1, tiled=True)  # [Q, devices·k], device order
        ids = jax.lax.all_gather(ids, "data", axis=1, tiled=True)
        top, where = jax.lax.top_k(scores, k)
        return top, jnp.take_along_axis(ids, where, axis=1)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P(), P()), check_vma=False)(
        queries, corpus
    )


def exact_top_k(
    queries: np.ndarray,
    corpus: np.ndarray,
    k: int = 100,
    chunk_size: int = 8192,
    query_batch: int = 1024,
    mesh=None,
):
    """(scores [Q, k] float32, corpus indices [Q, k] int32), best first, ties by lower index.

    With `mesh`, the corpus is sharded over its 'data' axis (each device holds 1/devices of it).
    """
    n = len(corpus)
    k = min(k, n)
    devices = 1 if mesh is None else mesh.shape["data"]
    chunk_size = max(1, min(chunk_size, -(-n // devices)))
    padded = np.pad(np.asarray(corpus, np.float32), ((0, (-n) % (chunk_size * devices)), (0, 0)))
    if mesh is None:
        corpus_on_device, search = jnp.asarray(padded), functools.partial(_top_k, n=n)
    else:
        corpus_on_device = jax.device_put(padded, NamedSharding(mesh, P("data")))
        search = functools.partial(_sharded_top_k, n=n, mesh=mesh)
    out_scores, out_ids = [], []
    for start in range(0, len(queries), query_batch):
        s, i = search(jnp.asarray(queries[start : start + query_batch], jnp.float32), corpus_on_device, k, chunk_size)
        out_scores.append(np.asarray(s))
        out_ids.append(np.asarray(i))
    return np.concatenate(out_scores), np.concatenate(out_ids)
