"""Encode texts with a dual encoder in fixed-size batches sharded over a mesh's 'data' axis.

Texts are sorted by token count and each batch is cut to the shortest of `length_buckets` evenly
spaced lengths that holds its longest row (trailing padding changes nothing: attention and mean
pooling mask it, and T5's position bias is relative), so a corpus of short texts costs its real
length, not the maximum; at most `length_buckets` compilations per (model, side), and the last
batch is padded to the compiled batch size.
With a mesh, each batch is split over the 'data' devices (of every process: each fills its own
devices' rows, and the embeddings are gathered back to every process) and the parameters are
laid out by the partitioning rules, so encoding uses every device the mesh holds.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from samtone_jax import partitioning
from samtone_jax.data.sentencepiece_tokens import encode_texts as tokenize
from samtone_jax.errors import BadValueError
from samtone_jax.models import init_params

SIDES = ("query", "document")


@functools.cache
def _compiled(model, side: str):
    """One jitted apply per (model, side), shared by every TextEncoder of that model (the training
    hook re-encodes with new parameters without recompiling)."""
    if side not in SIDES:
        raise BadValueError(f"side must be one of {SIDES}, got {side!r}")
    method = model.encode_queries if side == "query" else model.encode_documents
    return jax.jit(functools.partial(model.apply, method=method))


class TextEncoder:
    """Compiled, sharded text -> embedding for one model (parameters fixed, or given per call)."""

    def __init__(self, model, params, vocabulary, mesh=None, batch_size: int = 256, length_buckets: int = 8):
        if length_buckets < 1:
            raise BadValueError(f"length_buckets must be >= 1 (1 = always the full length), got {length_buckets}")
        self.model, self.vocabulary, self.mesh, self.length_buckets = model, vocabulary, mesh, length_buckets
        devices = 1 if mesh is None else mesh.shape["data"]
        self.batch_size = -(-max(batch_size, 1) // devices) * devices  # a multiple of the data devices
        self._tokens_sharding = None if mesh is None else NamedSharding(mesh, P("data"))
        self.params = None if params is None else self.place(params)

    def place(self, params):
        """`params` laid out on the mesh by the partitioning rules (a no-op for arrays already there)."""
        if self.mesh is None:
            return params
        boxed = jax.eval_shape(lambda: init_params(self.model, jax.random.PRNGKey(0)))
        return jax.device_put(params, partitioning.param_shardings(self.mesh, boxed))

    def encode_tokens(self, tokens: np.ndarray, side: str, params=None) -> np.ndarray:
        """tokens [N, L] int32 (N <= batch_size, the same on every process) -> [N, P] float32."""
        n = len(tokens)
        if n < self.batch_size:  # pad to the compiled shape (padding rows are dropped below)
            tokens = np.concatenate([tokens, np.zeros((self.batch_size - n, tokens.shape[1]), tokens.dtype)])
        if self._tokens_sharding is not None:
            tokens = jax.make_array_from_callback(tokens.shape, self._tokens_sharding, lambda index: tokens[index])
        out = _compiled(self.model, side)({"params": self.params if params is None else params}, tokens)
        if not out.is_fully_addressable:  # a multi-process mesh: every process gets all rows
            from jax.experimental import multihost_utils

            out = multihost_utils.process_allgather(out, tiled=True)
        return np.asarray(out)[:n]

    def encode(self, texts: list[str], length: int, side: str, progress=None, params=None) -> np.ndarray:
        """[N, P] float32 L2-normalised embeddings of `texts` on the `side` tower; `progress(n)` is
        called after each batch with the number of texts done in it."""
        return self.encode_all(tokenize(self.vocabulary, list(texts), length)[0], side, progress, params)

    def bucket_length(self, used: int, full: int) -> int:
        """The shortest of the `length_buckets` lengths ceil(full·j / buckets) that is >= used."""
        step = full / self.length_buckets
        return min(full, max(1, int(np.ceil(np.ceil(used / step) * step))))

    def encode_all(self, tokens: np.ndarray, side: str, progress=None, params=None) -> np.ndarray:
        """tokens [N, L] (any N; padding 0 at the end of each row) -> [N, P], in length-sorted batches."""
        if len(tokens) == 0:
            return np.zeros((0, 0), np.float32)
        full = tokens.shape[1]
        used = np.where((tokens != 0).any(axis=1), full - np.argmax(tokens[:, ::-1] != 0, axis=1), 0)
        order = np.argsort(used, kind="stable")
        out = None
        for start in range(0, len(tokens), self.batch_size):
            rows = order[start : start + self.batch_size]
            length = self.bucket_length(int(used[rows].max()), full)
            embeddings = self.encode_tokens(tokens[rows, :length], side, params)
            if out is None:
                out = np.zeros((len(tokens), embeddings.shape[1]), embeddings.dtype)
            out[rows] = embeddings
            if progress is not None:
                progress(len(rows))
        return out
