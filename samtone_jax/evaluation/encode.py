"""Encode texts with a dual encoder in fixed-size batches sharded over a mesh's 'data' axis.

One compilation per (side, batch size, length): the last batch is padded to the compiled shape.
With a mesh, each batch is split over the 'data' devices and the parameters are laid out by the
partitioning rules (replicated on a pure data-parallel mesh), so encoding uses every local device.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from samtone_jax import partitioning
from samtone_jax.data.pipeline import encode_texts as tokenize
from samtone_jax.models import init_params

SIDES = ("query", "document")


class TextEncoder:
    """Compiled, sharded text -> embedding for one model and parameter set."""

    def __init__(self, model, params, vocabulary, mesh=None, batch_size: int = 256):
        self.model, self.vocabulary, self.mesh = model, vocabulary, mesh
        devices = 1 if mesh is None else mesh.shape["data"]
        self.batch_size = -(-max(batch_size, 1) // devices) * devices  # a multiple of the data devices
        if mesh is None:
            self.params, self._tokens_sharding = params, None
        else:
            boxed = jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(0)))
            shardings = partitioning.param_shardings(mesh, boxed)
            self.params = jax.device_put(params, shardings)
            self._tokens_sharding = NamedSharding(mesh, P("data"))
        self._apply = {}

    def _compiled(self, side: str):
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")
        if side not in self._apply:
            method = self.model.encode_queries if side == "query" else self.model.encode_documents
            self._apply[side] = jax.jit(functools.partial(self.model.apply, method=method))
        return self._apply[side]

    def encode_tokens(self, tokens: np.ndarray, side: str) -> np.ndarray:
        """tokens [N, L] int32 (N <= batch_size) -> [N, P] float32 L2-normalised."""
        n = len(tokens)
        if n < self.batch_size:  # pad to the compiled shape (all-padding rows embed to zeros)
            tokens = np.concatenate([tokens, np.zeros((self.batch_size - n, tokens.shape[1]), tokens.dtype)])
        if self._tokens_sharding is not None:
            tokens = jax.device_put(tokens, self._tokens_sharding)
        return np.asarray(self._compiled(side)({"params": self.params}, tokens))[:n]

    def encode(self, texts: list[str], length: int, side: str, progress=None) -> np.ndarray:
        """[N, P] float32 L2-normalised embeddings of `texts` on the `side` tower; `progress(n)` is
        called after each batch with the number of texts done in it."""
        out = []
        for start in range(0, len(texts), self.batch_size):
            tokens, _ = tokenize(self.vocabulary, texts[start : start + self.batch_size], length)
            out.append(self.encode_tokens(tokens, side))
            if progress is not None:
                progress(len(tokens))
        if not out:
            return np.zeros((0, 0), np.float32)
        return np.concatenate(out)
