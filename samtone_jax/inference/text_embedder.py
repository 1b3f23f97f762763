"""Encode texts with a dual encoder in fixed-size batches sharded over a mesh's 'data' axis.

Texts are sorted by token count and each goes to the shortest length of a ladder (8, 16, 24, 32, 48,
64, 96, 128, 192, 256, 384, ...: steps of at most 1.5× from 16 on, capped by the full length) that holds it
(trailing padding changes nothing: attention and mean pooling mask it, and relative position biases
see only differences). A batch holds texts of one ladder length and about `tokens_per_batch` tokens
(at most `batch_size` rows), so a few long texts never drag a batch of short ones to their length,
and a corpus costs about its real tokens: within 1.5× of them above 16 tokens, plus one part-filled batch a length
(its rows rounded up to a power of two). Compilations: at most two a ladder length per (model, side),
kept by the persistent compilation cache.

Packed (`packing_max_segments` S): the length-sorted texts are instead laid next-fit into rows of
the full length, up to S texts a row (data/packing.py's rows: attention within each text), and a
batch is `batch_size` such rows: one compilation per (model, side), and short texts cost their
tokens even below the shortest bucket. Each embedding equals the unpacked one (tests/test_inference.py).

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

from samtone_jax.core import stop_request
from samtone_jax.core.errors import BadValueError
from samtone_jax.data.packing import write_rows
from samtone_jax.data.sentencepiece_tokens import tokenize_texts as tokenize
from samtone_jax.models import init_params, partitioning
from samtone_jax.models.layout import SIDES


@functools.cache
def _compiled(model, side: str, max_segments: int | None = None):
    """One jitted apply per (model, side), shared by every TextEmbedder of that model (the training
    hook re-encodes with new parameters without recompiling): (variables, tokens) -> [N, P], or with
    `max_segments` (variables, tokens, segment_ids) of packed rows -> [rows, max_segments, P]."""
    if side not in SIDES:
        raise BadValueError(f"side must be one of {SIDES}, got {side!r}")
    if max_segments is None:
        method = model.encode_queries if side == "query" else model.encode_documents
        return jax.jit(functools.partial(model.apply, method=method))

    def apply(variables, tokens, segment_ids):
        return model.apply(variables, tokens, segment_ids, side, max_segments, method=model.encode_packed)

    return jax.jit(apply)


TOKENS_PER_BATCH = 8192  # an unpacked batch's padded tokens (rows × length), whatever its length


@functools.cache
def ladder(limit: int = 1 << 20) -> tuple[int, ...]:
    """8, 16, 24, 32, 48, 64, 96, 128, ...: 8 × powers of two and their 1.5×, up to `limit`."""
    out, power = [8], 16
    while power <= limit:
        out += [power, power * 3 // 2]
        power *= 2
    return tuple(out)


def next_fit_rows(lengths: np.ndarray, length: int, max_segments: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, row, index): the texts in `order` (shortest first) laid next-fit into rows of
    `length` tokens, at most `max_segments` a row; text order[i] goes to row[i], segment index[i]."""
    order = np.argsort(lengths, kind="stable")
    row, index = np.zeros(len(order), np.int64), np.zeros(len(order), np.int64)
    r, s, used = 0, 0, 0
    for i, t in enumerate(order):
        n = int(lengths[t])
        if s == max_segments or used + n > length:
            r, s, used = r + 1, 0, 0
        row[i], index[i] = r, s
        s, used = s + 1, used + n
    return order, row, index


class TextEmbedder:
    """Compiled, sharded text -> embedding for one model (parameters fixed, or given per call)."""

    def __init__(
        self,
        model,
        params,
        vocabulary,
        mesh=None,
        batch_size: int = 256,
        bucketed: bool = True,
        packing_max_segments: int | None = None,
        tokens_per_batch: int = TOKENS_PER_BATCH,
    ):
        if tokens_per_batch < 1:
            raise BadValueError(f"tokens_per_batch must be >= 1, got {tokens_per_batch}")
        if packing_max_segments is not None and packing_max_segments < 1:
            raise BadValueError(f"packing_max_segments must be >= 1 (None: unpacked), got {packing_max_segments}")
        self.model, self.vocabulary, self.mesh, self.bucketed = model, vocabulary, mesh, bucketed
        self.packing_max_segments, self.tokens_per_batch = packing_max_segments, tokens_per_batch
        self.devices = devices = 1 if mesh is None else mesh.shape["data"]
        self.batch_size = -(-max(batch_size, 1) // devices) * devices  # a multiple of the data devices
        self._tokens_sharding = None if mesh is None else NamedSharding(mesh, P("data"))
        self.params = None if params is None else self.place(params)

    def place(self, params):
        """`params` laid out on the mesh by the partitioning rules (a no-op for arrays already there)."""
        if self.mesh is None:
            return params
        boxed = jax.eval_shape(lambda: init_params(self.model, jax.random.PRNGKey(0)))
        return jax.device_put(params, partitioning.param_shardings(self.mesh, boxed))

    def encode_tokens(self, tokens: np.ndarray, side: str, params=None, segment_ids=None, rows=None) -> np.ndarray:
        """tokens [N, L] int32 (N <= rows, default batch_size; the same on every process) -> [N, P]
        float32; packed rows (with their segment_ids [batch_size, L]) -> [batch_size, packing_max_segments, P]."""
        n, rows = len(tokens), rows or self.batch_size
        if n < rows:  # pad to the compiled shape (padding rows are dropped below)
            tokens = np.concatenate([tokens, np.zeros((rows - n, tokens.shape[1]), tokens.dtype)])
        arrays = (tokens,) if segment_ids is None else (tokens, segment_ids)
        if self._tokens_sharding is not None:
            arrays = tuple(
                jax.make_array_from_callback(a.shape, self._tokens_sharding, lambda index, a=a: a[index])
                for a in arrays
            )
        max_segments = None if segment_ids is None else self.packing_max_segments
        out = _compiled(self.model, side, max_segments)({"params": self.params if params is None else params}, *arrays)
        if not out.is_fully_addressable:  # a multi-process mesh: every process gets all rows
            from jax.experimental import multihost_utils

            out = multihost_utils.process_allgather(out, tiled=True)
        return np.asarray(out)[:n]

    def encode(self, texts: list[str], length: int, side: str, progress=None, params=None) -> np.ndarray:
        """[N, P] float32 L2-normalised embeddings of `texts` on the `side` tower; `progress(n)` is
        called after each batch with the number of texts done in it."""
        return self.encode_all(tokenize(self.vocabulary, list(texts), length)[0], side, progress, params)

    def bucket_length(self, used: int, full: int) -> int:
        """The shortest ladder length (8·{1, 2, 3, 4, 6, 8, 12, ...}) >= used, at most `full`; `full`
        itself when not bucketed."""
        if not self.bucketed:
            return full
        return min(full, next(length for length in ladder() if length >= used))

    def rows_for(self, length: int, texts: int | None = None) -> int:
        """Rows of a batch at `length`: about tokens_per_batch tokens, at most batch_size, a multiple of
        the data devices; for the last `texts` of a length, the power of two that holds them (fewer
        padding rows, at most one more compilation a length)."""
        rows = min(self.batch_size, max(1, self.tokens_per_batch // length))
        if texts is not None and texts < rows:
            rows = 1 << max(0, int(texts - 1).bit_length())
        return -(-rows // self.devices) * self.devices

    def encode_all(self, tokens: np.ndarray, side: str, progress=None, params=None) -> np.ndarray:
        """tokens [N, L] (any N; padding 0 at the end of each row) -> [N, P], in length-sorted batches."""
        if len(tokens) == 0:
            return np.zeros((0, 0), np.float32)
        full = tokens.shape[1]
        used = np.where((tokens != 0).any(axis=1), full - np.argmax(tokens[:, ::-1] != 0, axis=1), 0)
        if self.packing_max_segments is None:
            batches = self._bucketed(tokens, used, side, params)
        else:
            batches = self._packed(tokens, used, side, params)
        out = None
        for texts, embeddings in batches:
            if out is None:
                out = np.zeros((len(tokens), embeddings.shape[1]), embeddings.dtype)
            out[texts] = embeddings
            if progress is not None:
                progress(len(texts))
            stop_request.check()  # a training run's stop (SIGTERM) ends its eval here, within a batch
        return out

    def _bucketed(self, tokens, used, side, params):
        """(text indices, their embeddings) per batch: length-sorted texts of one ladder length, about
        tokens_per_batch tokens a batch (rows_for)."""
        order = np.argsort(used, kind="stable")
        lengths = np.array([self.bucket_length(int(u), tokens.shape[1]) for u in used[order]])
        start = 0
        while start < len(order):
            length = int(lengths[start])
            same = int(np.searchsorted(lengths, length, side="right")) - start  # texts left at this length
            rows = self.rows_for(length)
            rows = rows if same >= rows else self.rows_for(length, same)
            texts = order[start : start + min(rows, same)]
            yield texts, self.encode_tokens(tokens[texts, :length], side, params, rows=rows)
            start += len(texts)

    def _packed(self, tokens, used, side, params):
        """(text indices, their embeddings) per batch of `batch_size` packed rows."""
        segments = self.packing_max_segments
        order, row, index = next_fit_rows(used, tokens.shape[1], segments)
        # Rows ascend along `order` (every row holds a text): each batch of rows is one slice of it.
        firsts = np.arange(0, int(row[-1]) + 1, self.batch_size)
        bounds = np.searchsorted(row, np.append(firsts, row[-1] + 1))
        for first, start, stop in zip(firsts, bounds[:-1], bounds[1:], strict=True):
            texts = order[start:stop]
            packed = write_rows(
                tokens[texts], used[texts], row[start:stop] - first, index[start:stop], self.batch_size, segments
            )
            embeddings = self.encode_tokens(packed.tokens, side, params, packed.segment_ids)
            yield texts, embeddings.reshape(-1, embeddings.shape[-1])[packed.slots]
