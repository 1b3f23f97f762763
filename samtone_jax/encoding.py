"""Encoding a batch with the dual encoder, with dropout keys that belong to examples.

The dropout mask of an example is drawn from fold_in(step key, side, global example index), so
it is the same whether the batch is encoded at once, in GradCache chunks, on one device or on
many. That is what makes GradCache's gradients *equal* to the plain step's with dropout on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

SIDES = {"query": 0, "document": 1, "negative": 2}


def encode(model, params, tokens: jax.Array, side: str, rng: jax.Array | None, index: jax.Array | None = None):
    """tokens [N, L] -> L2-normalised embeddings [N, P] float32.

    rng None: deterministic (no dropout). Otherwise example i uses the key
    fold_in(fold_in(rng, side), index[i]) (index defaults to 0..N-1).
    """
    method = model.encode_queries if side == "query" else model.encode_documents
    variables = {"params": params}
    if rng is None or model.config.dropout_rate == 0.0:
        return model.apply(variables, tokens, True, method=method)
    index = jnp.arange(tokens.shape[0]) if index is None else index
    side_key = jax.random.fold_in(rng, SIDES[side])
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(side_key, index)

    def one(example, key):
        return model.apply(variables, example[None], False, method=method, rngs={"dropout": key})[0]

    return jax.vmap(one)(tokens, keys)


def encode_batch(model, params, batch: dict, rng: jax.Array | None):
    """(q [B, P], d [B, P], negatives [B, K, P] | None) of a batch of model features."""
    q = encode(model, params, batch["query_tokens"], "query", rng)
    d = encode(model, params, batch["doc_tokens"], "document", rng)
    n = None
    if "negative_tokens" in batch:
        b, k, length = batch["negative_tokens"].shape
        n = encode(model, params, batch["negative_tokens"].reshape(b * k, length), "negative", rng).reshape(b, k, -1)
    return q, d, n
