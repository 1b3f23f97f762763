"""Encoding a batch with the dual encoder, with dropout keys that belong to examples (or rows).

The dropout mask of an example is drawn from fold_in(step key, side, global example index), so
it is the same whether the batch is encoded at once, in GradCache chunks, on one device or on
many. That is what makes GradCache's gradients *equal* to the plain step's with dropout on.

A batch is encoded as a list of *inputs* (one per token array: queries, documents, hard
negatives; packed: query rows and document rows), each giving an output array, and `assemble`
turns the outputs into the loss's (q [B, P], d [B, P], n [B, K, P] | None). Unpacked, an output is
[N, P] per text; packed (data/packing.py), [rows, S, P] per row slot, and `assemble` picks each
pair's texts by their slots. The plain step and GradCache (grad_cache.py) share both.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from samtone_jax.models.layer_stack import has_dropout

# Each kind of input draws its dropout keys from its own stream: fold_in(step key, DROPOUT_STREAM[side]).
DROPOUT_STREAM = {"query": 0, "document": 1, "negative": 2}


@dataclasses.dataclass(frozen=True)
class Input:
    """One encoded array: `tokens` [N, L] of `side`; packed rows also carry segment_ids [N, L] and
    give [N, max_segments, P]."""

    name: str
    side: str
    tokens: jax.Array
    segment_ids: jax.Array | None = None

    def arrays(self) -> tuple:
        return (self.tokens,) if self.segment_ids is None else (self.tokens, self.segment_ids)


def embed(model, params, arrays: tuple, side: str, rng, index=None, max_segments: int | None = None):
    """(tokens [N, L],) -> L2-normalised embeddings [N, P] float32; (tokens, segment_ids) of packed
    rows -> [N, max_segments, P].

    rng None: deterministic (no dropout). Otherwise row i uses the key
    fold_in(fold_in(rng, side), index[i]) (index defaults to 0..N-1).
    """
    variables = {"params": params}
    if len(arrays) == 1:
        method = model.encode_queries if side == "query" else model.encode_documents

        def apply(x, deterministic, **rngs):
            return model.apply(variables, x[0], deterministic, method=method, **rngs)
    else:
        encoder_side = "query" if side == "query" else "document"

        def apply(x, deterministic, **rngs):
            return model.apply(
                variables, *x, encoder_side, max_segments, deterministic, method=model.encode_packed, **rngs
            )

    if rng is None or not has_dropout(model.config):
        return apply(arrays, True)
    n = arrays[0].shape[0]
    index = jnp.arange(n) if index is None else index
    side_key = jax.random.fold_in(rng, DROPOUT_STREAM[side])
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(side_key, index)

    def one(row, key):
        return apply(tuple(a[None] for a in row), False, rngs={"dropout": key})[0]

    return jax.vmap(one)(arrays, keys)


def inputs(batch: dict) -> list[Input]:
    """The batch's encoded arrays; negatives flattened to [B·K, L]. Packed (query_segment_ids
    present): the query rows and the document rows (documents and negatives share them)."""
    if "query_segment_ids" in batch:
        return [
            Input("query_tokens", "query", batch["query_tokens"], batch["query_segment_ids"]),
            Input("doc_tokens", "document", batch["doc_tokens"], batch["doc_segment_ids"]),
        ]
    out = [Input("query_tokens", "query", batch["query_tokens"]), Input("doc_tokens", "document", batch["doc_tokens"])]
    if "negative_tokens" in batch:
        b, k, length = batch["negative_tokens"].shape
        out.append(Input("negative_tokens", "negative", batch["negative_tokens"].reshape(b * k, length)))
    return out


def assemble(batch: dict, outputs: dict[str, jax.Array]):
    """(q [B, P], d [B, P], n [B, K, P] | None) from the inputs' outputs (by input name)."""
    if "query_segment_ids" in batch:
        queries, documents = (outputs[k].reshape(-1, outputs[k].shape[-1]) for k in ("query_tokens", "doc_tokens"))
        n = documents[batch["negative_slot"]] if "negative_slot" in batch else None
        return queries[batch["query_slot"]], documents[batch["doc_slot"]], n
    n = None
    if "negative_tokens" in batch:
        b, k = batch["negative_tokens"].shape[:2]
        n = outputs["negative_tokens"].reshape(b, k, -1)
    return outputs["query_tokens"], outputs["doc_tokens"], n


def embed_batch(model, params, batch: dict, rng: jax.Array | None, max_segments: int | None = None):
    """(q [B, P], d [B, P], negatives [B, K, P] | None) of a batch of model features, packed or not
    (packed: `max_segments`, the packer's texts-per-row limit)."""
    outputs = {x.name: embed(model, params, x.arrays(), x.side, rng, None, max_segments) for x in inputs(batch)}
    return assemble(batch, outputs)
