"""Maximum-inner-product search on device (exact, or lax.approx_max_k on TPU), memory bounded by
the chunk size; `top_k` also dispatches to the FAISS backends (faiss_search.py) for CPU hosts.

The corpus is scored in chunks of `chunk_size` rows; each chunk merges into the running top-k, so
memory is O(queries × (k + chunk)), never O(queries × corpus). On CPU devices the merge is a
native kernel (native_top_k.py: per-query heaps, a vectorised pass against each heap's worst
score); elsewhere `lax.top_k` over the [k + chunk] candidates. With a mesh, the corpus is sharded
over 'data': each device keeps the top-k of its shard, the k·devices candidates are all-gathered
and merged. Ties keep the lower corpus index everywhere (lax.top_k is stable, the kernel's heaps
order by (score, id), and earlier chunks / devices hold lower ids).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from samtone_jax.compression import quantization
from samtone_jax.core.errors import BadValueError
from samtone_jax.evaluation import native_top_k

# Float scores at full float32 precision on every platform. Without it an f32 matmul runs at JAX's
# default, which "leans toward speed" (docs.jax.dev, Matmul precision): one bfloat16 pass on TPU
# (8-bit mantissas), TF32 on NVIDIA GPUs since Ampere (10 bits), so "exact" search ranked by rounded
# scores and could swap near-tied documents. On the CPU both are float32 (nothing changes there);
# benchmarks/search_precision_check.py measures the difference on an accelerator.
EXACT = jax.lax.Precision.HIGHEST


def _select(scores, k: int, recall_target: float | None):
    """(values, positions) of the k largest per row: exact, or TPU's approximate partial reduction."""
    if recall_target is None:
        return jax.lax.top_k(scores, k)
    return jax.lax.approx_max_k(scores, k, recall_target=recall_target)


SELECTIONS = ("auto", "native", "lax")


def _use_native(selection: str, recall_target: float | None) -> bool:
    """Whether chunks merge with the native CPU kernel (on CPU devices; others always use lax)."""
    if selection not in SELECTIONS:
        raise BadValueError(f"unknown top-k selection {selection!r}; choose one of {SELECTIONS}")
    if selection == "lax" or recall_target is not None:
        return False
    if selection == "auto" and jax.default_backend() != "cpu":  # TPU / GPU hosts: no compiler run, no warning
        return False
    if selection == "native" and not native_top_k.available():
        raise RuntimeError(
            f"selection='native' but the native top-k kernel is unavailable: {native_top_k.unavailable_reason()}"
        )
    return native_top_k.available()


def chunked_top_k(
    queries,
    corpus,
    k: int,
    chunk_size: int,
    n: int,
    offset=0,
    recall_target=None,
    selection: str = "auto",
    scale=None,
    bits: int | None = None,
    exact: bool = True,
):
    """Top-k over `corpus` rows (global ids offset + row; rows with id >= n are padding).

    `corpus` may be float32, bfloat16, int8 (optionally with `scale` [rows] float32: row r is
    corpus[r] · scale[r]), or uint8 sign bits packed 8 a byte (`bits` = D, quantization.pack_bits;
    queries then ±1 [Q, D], so scores are D − 2 · Hamming distance); each chunk is widened to float32
    inside the scan, one chunk at a time, so a compressed corpus never exists whole in float32 (its
    compiled temporaries stay a chunk's). A bfloat16
    corpus on XLA:CPU does: CPU dots have no bfloat16 kernel, and XLA moves the convert it inserts
    out of the loop onto the whole corpus (TPU and GPU dots read bfloat16 as stored).

    selection 'auto' merges each chunk with the native kernel on CPU devices (native_top_k.py) when
    it is built, else with lax.top_k; 'lax' always uses lax.top_k; 'native' fails if it is not built.
    `exact` False scores float rows at the platform's default matmul precision (see EXACT): for
    callers that rank by scores computed that way anyway (ADORE's loss).
    """
    chunks = corpus.reshape(-1, chunk_size, corpus.shape[1])
    init = (jnp.full((queries.shape[0], k), -jnp.inf, jnp.float32), jnp.full((queries.shape[0], k), -1, jnp.int32))

    def lax_merge(scores, start, best_scores, best_ids):
        ids = start + jnp.arange(chunk_size, dtype=jnp.int32)
        scores = jnp.where(ids[None, :] < n, scores, -jnp.inf)  # padding rows never win
        all_scores = jnp.concatenate([best_scores, scores], axis=1)
        all_ids = jnp.concatenate([best_ids, jnp.broadcast_to(ids, scores.shape)], axis=1)
        top, where = _select(all_scores, k, recall_target)
        return top, jnp.take_along_axis(all_ids, where, axis=1)

    def native_merge(scores, start, best_scores, best_ids):
        return native_top_k.merge(scores, start, best_scores, best_ids, n)

    native = _use_native(selection, recall_target)
    # Integer codes (±1 bits; int8 codes, whose queries must be int8 codes too: ExactIndex checks) are
    # exact at any matmul precision for D <= 1024 (partial sums below 2^24); float rows are multiplied
    # at full float32 (see EXACT).
    precision = None if not exact or bits or (corpus.dtype == jnp.int8 and scale is None) else EXACT

    def merge(carry, x):
        chunk, chunk_scale, start = x
        rows = quantization.unpack_signs(chunk, bits) if bits else chunk.astype(jnp.float32)
        scores = jnp.einsum("qd,cd->qc", queries, rows, precision=precision, preferred_element_type=jnp.float32)
        if scale is not None:
            scores = scores * chunk_scale[None, :]
        args = (scores, offset + start, *carry)
        if native:
            return jax.lax.platform_dependent(*args, cpu=native_merge, default=lax_merge), None
        return lax_merge(*args), None

    starts = jnp.arange(chunks.shape[0], dtype=jnp.int32) * chunk_size
    scales = starts if scale is None else scale.reshape(-1, chunk_size)  # (a placeholder without scale)
    (scores, ids), _ = jax.lax.scan(merge, init, (chunks, scales, starts))
    # The native kernel leaves heaps; lax.top_k's rows are already in this order (a no-op for them).
    return native_top_k.sort_best(scores, ids) if native else (scores, ids)


RESCORE_BATCH = 256  # queries a rescoring step decodes at once: [batch, depth, D] float32 candidates


def _rescore(float_queries, corpus, ids, offset, bits, ranges):
    """Scores [Q, K'] of the candidates `ids` (global corpus rows) by the float queries [Q, D]
    against their decoded codes (quantization.decode: int8 codes with their `ranges`, packed bits
    as ±1), for the candidates `corpus` (rows offset … offset + len) holds; 0 for the others
    (another shard's: a psum over the shards adds each candidate's score once)."""
    precision, dim = ("binary", bits) if bits else ("int8", float_queries.shape[1])

    def one(args):
        q, rows = args
        local = rows - offset
        held = (local >= 0) & (local < corpus.shape[0])
        codes = corpus[jnp.clip(local, 0, corpus.shape[0] - 1)]  # [K', W]
        decoded = quantization.decode(codes, precision, dim, ranges)
        return jnp.where(held, jnp.matmul(decoded, q, precision=EXACT), 0.0)

    return jax.lax.map(one, (float_queries, ids), batch_size=RESCORE_BATCH)


def _best(scores, ids, k: int):
    """The k best of scores [Q, K'] with their ids, ties in the candidates' order (lax.top_k is stable)."""
    top, where = jax.lax.top_k(scores, k)
    return top, jnp.take_along_axis(ids, where, axis=1)


_STATIC = ("k", "chunk_size", "n", "recall_target", "selection", "bits", "depth")


@functools.partial(jax.jit, static_argnames=_STATIC)
def _top_k(
    queries, corpus, k, chunk_size, n, recall_target=None, selection="auto", bits=None, rescore=None, depth=None
):
    if rescore is None:
        return chunked_top_k(
            queries, corpus, k, chunk_size, n, recall_target=recall_target, selection=selection, bits=bits
        )
    float_queries, ranges = rescore
    _, ids = chunked_top_k(
        queries, corpus, depth, chunk_size, n, recall_target=recall_target, selection=selection, bits=bits
    )
    return _best(_rescore(float_queries, corpus, ids, 0, bits, ranges), ids, k)


@functools.partial(jax.jit, static_argnames=("mesh", *_STATIC))
def _sharded_top_k(
    queries, corpus, k, chunk_size, n, mesh, recall_target=None, selection="auto", bits=None, rescore=None, depth=None
):
    rows = corpus.shape[0] // mesh.shape["data"]
    first = depth if rescore is not None else k

    def local(q, shard, rescore):
        offset = jax.lax.axis_index("data") * rows
        scores, ids = chunked_top_k(q, shard, first, chunk_size, n, offset, recall_target, selection, bits=bits)
        scores = jax.lax.all_gather(scores, "data", axis=1, tiled=True)  # [Q, devices·k], device order
        ids = jax.lax.all_gather(ids, "data", axis=1, tiled=True)
        scores, ids = _best(scores, ids, first)
        if rescore is None:
            return scores, ids
        float_queries, ranges = rescore  # each shard scores the candidates it holds; the sum has them all
        return _best(jax.lax.psum(_rescore(float_queries, shard, ids, offset, bits, ranges), "data"), ids, k)

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P()), out_specs=(P(), P()), check_vma=False)(
        queries, corpus, rescore
    )


def auto_chunk_size(query_batch: int, dim: int) -> int:
    """Corpus rows per chunk: the power of two whose scores and rows (query_batch + dim) × chunk
    float32 take about 16 MiB, so a chunk stays in a server CPU's last-level cache between its
    matmul and its merge; 1,024 … 16,384 (measured in benchmarks/search_bench.py --chunk_sizes)."""
    rows = (16 << 20) // (4 * (query_batch + dim))
    return int(min(16384, max(1024, 2 ** int(np.log2(max(rows, 1))))))


class ExactIndex:
    """A corpus placed on device once (padded to whole chunks, sharded over the mesh's 'data' axis)
    and searched exactly, like faiss's IndexFlatIP: build it once, then `search` query batches.

    corpus [N, D] float (searched in float32); or compressed as serving stores it
    (quantization.py), searched as stored: int8 codes [N, D] (scores are the integer inner products
    of int8 queries), or packed sign bits uint8 [N, ceil(D / 8)] with `bits` = D (Hamming search:
    scores D − 2 · Hamming distance to packed queries). `chunk_size` None picks `auto_chunk_size`.
    `recall_target` (e.g. 0.95) selects with lax.approx_max_k, which is fast on TPU and exact (a
    sort) elsewhere. `selection` picks how exact chunks merge on CPU devices: 'auto' (the native
    kernel when it builds, else lax.top_k), 'native', or 'lax'.

    A compressed index also re-ranks on device (sentence-transformers' rescoring): `search` with
    `float_queries` takes the top `depth` by the codes and re-scores them by the float queries
    against the candidates' decoded codes (int8 needs the codes' `ranges` [2, D]; bits decode as ±1).
    """

    def __init__(
        self,
        corpus: np.ndarray,
        mesh=None,
        chunk_size: int | None = None,
        query_batch: int = 1024,
        recall_target: float | None = None,
        selection: str = "auto",
        bits: int | None = None,
        ranges: np.ndarray | None = None,
    ):
        corpus = np.asarray(corpus)
        if corpus.ndim != 2:
            raise BadValueError(f"the corpus must be [N, D] embeddings, got shape {corpus.shape}")
        if bits is not None and (corpus.dtype != np.uint8 or corpus.shape[1] != -(-bits // 8)):
            raise BadValueError(
                f"a binary corpus of {bits} bits a vector is uint8 [N, {-(-bits // 8)}] (quantization.pack_bits); "
                f"got {corpus.dtype} {corpus.shape}"
            )
        if bits is None and corpus.dtype != np.int8:
            corpus = corpus.astype(np.float32)
        _use_native(selection, recall_target)  # a bad `selection` fails here, not at the first search
        self.n, self.dim, self.mesh, self.query_batch = len(corpus), bits or corpus.shape[1], mesh, query_batch
        self.dtype, self.bits = corpus.dtype, bits
        self.ranges = None if ranges is None else jnp.asarray(ranges, jnp.float32)  # int8 codes' (to decode)
        if ranges is not None:
            quantization.check_ranges(self.ranges, self.dim)
        devices = 1 if mesh is None else mesh.shape["data"]
        chunk_size = chunk_size or auto_chunk_size(query_batch, self.dim)
        self.chunk_size = max(1, min(chunk_size, -(-self.n // devices)))
        padded = np.pad(corpus, ((0, (-self.n) % (self.chunk_size * devices)), (0, 0)))
        options = {"n": self.n, "recall_target": recall_target, "selection": selection, "bits": bits}
        if mesh is None:
            self.corpus, self._search = jnp.asarray(padded), functools.partial(_top_k, **options)
        else:
            self.corpus = jax.device_put(padded, NamedSharding(mesh, P("data")))
            self._search = functools.partial(_sharded_top_k, mesh=mesh, **options)

    def _as_rows(self, queries: np.ndarray) -> np.ndarray:
        """Queries in the corpus's representation -> float32 [Q, D] rows to multiply with it."""
        queries = np.asarray(queries)
        width = self.dim if self.bits is None else -(-self.bits // 8)
        kind = {np.dtype(np.int8): "int8 codes ", np.dtype(np.uint8): "packed bits "}.get(self.dtype, "")
        if queries.ndim != 2 or queries.shape[1] != width or (kind and queries.dtype != self.dtype):
            raise BadValueError(
                f"queries must be {kind}[Q, {width}] to search this corpus, got {queries.dtype} {queries.shape}"
            )
        if self.bits is not None:
            return quantization.unpack_signs(queries, self.bits)
        return queries.astype(np.float32)

    def search(
        self, queries: np.ndarray, k: int = 100, float_queries: np.ndarray | None = None, depth: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(scores [Q, k] float32, corpus indices [Q, k] int32), best first, ties by lower index.
        With `float_queries` [Q, D] (an int8 / binary index): the top `depth` candidates re-ranked by
        the float queries against their decoded codes (scores: those inner products; ties in the
        index's order)."""
        queries = self._as_rows(queries)
        k = min(k, self.n)
        options = {}
        if float_queries is not None:
            float_queries = self._rescoring_queries(float_queries, len(queries))
            options["depth"] = max(k, min(depth or k, self.n))
        out_scores, out_ids = [], []
        for start in range(0, len(queries), self.query_batch):
            batch = jnp.asarray(queries[start : start + self.query_batch])
            if float_queries is not None:
                options["rescore"] = (jnp.asarray(float_queries[start : start + self.query_batch]), self.ranges)
            s, i = self._search(batch, self.corpus, k, self.chunk_size, **options)
            out_scores.append(np.asarray(s))
            out_ids.append(np.asarray(i))
        if not out_scores:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int32)
        return np.concatenate(out_scores), np.concatenate(out_ids)

    def _rescoring_queries(self, float_queries: np.ndarray, count: int) -> np.ndarray:
        """float_queries checked against this index: float [count, D], and an index that can decode."""
        float_queries = np.asarray(float_queries, np.float32)
        if float_queries.shape != (count, self.dim):
            raise BadValueError(f"rescoring needs float queries [{count}, {self.dim}], got {float_queries.shape}")
        if self.dtype == np.float32:
            raise BadValueError("rescoring re-ranks an int8 / binary index; this one is float32")
        if self.dtype == np.int8 and self.ranges is None:
            raise BadValueError("rescoring an int8 index decodes its codes: build the ExactIndex with their ranges")
        return float_queries


def exact_top_k(
    queries: np.ndarray,
    corpus: np.ndarray,
    k: int = 100,
    chunk_size: int | None = None,
    query_batch: int = 1024,
    mesh=None,
    recall_target: float | None = None,
    selection: str = "auto",
):
    """(scores [Q, k] float32, corpus indices [Q, k] int32), best first, ties by lower index:
    ExactIndex(corpus, ...).search(queries, k), for one set of queries. queries [Q, D], corpus [N, D];
    with `mesh`, each device holds 1/devices of the corpus."""
    index = ExactIndex(corpus, mesh, chunk_size, query_batch, recall_target, selection)
    return index.search(queries, k)


BACKENDS = ("exact", "approx", "faiss", "faiss_ivfpq")


def top_k(queries: np.ndarray, corpus: np.ndarray, k: int = 100, backend: str = "exact", mesh=None, **options):
    """(scores [Q, k], corpus indices [Q, k]) by `backend`:

    exact        exact_top_k on device (sharded over `mesh`), ties by lower index;
    approx       the same with lax.approx_max_k (options: recall_target, default 0.95);
    faiss        faiss.IndexFlatIP on the CPU: the same results as exact;
    faiss_ivfpq  faiss.IndexIVFPQ (options: nlist, nprobe, pq_m): approximate, for huge corpora.
    """
    if backend == "exact":
        return exact_top_k(queries, corpus, k, mesh=mesh, **options)
    if backend == "approx":
        return exact_top_k(queries, corpus, k, mesh=mesh, **{"recall_target": 0.95, **options})
    if backend in ("faiss", "faiss_ivfpq"):
        from samtone_jax.evaluation import faiss_search

        index = "flat" if backend == "faiss" else "ivfpq"
        return faiss_search.faiss_top_k(queries, corpus, k, index=index, **options)
    raise BadValueError(f"unknown search backend {backend!r} (gin evaluate.backend); choose one of {BACKENDS}")
