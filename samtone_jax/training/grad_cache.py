"""GradCache (Gao et al. 2021): a contrastive batch not limited by activation memory.

  1. embed the whole batch in chunks, keeping no activations (no autodiff through this pass);
  2. the loss and its gradient w.r.t. the *embeddings* on the full batch (cheap: B×D);
  3. per chunk, re-run the encoder under `jax.vjp` with the same dropout keys and pull the
     embedding gradient back to the parameters, accumulating.

Peak activation memory is that of one chunk; the result equals the plain step's loss and
gradients (to float tolerance), dropout included, because every example's dropout key depends
on its index only (samtone_jax/training/batch_embeddings.py). Chunks interleave the data shards (chunk j takes
rows j·c..(j+1)·c−1 of *every* device's slice), so each device works on every chunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from samtone_jax.core.errors import BadValueError
from samtone_jax.training.batch_embeddings import assemble, embed, inputs


def to_chunks(x: jax.Array, num_chunks: int, num_shards: int) -> jax.Array:
    """[B, ...] -> [num_chunks, B / num_chunks, ...], each chunk drawing equally from every shard."""
    b = x.shape[0]
    x = x.reshape(num_shards, num_chunks, b // (num_shards * num_chunks), *x.shape[1:])
    return jnp.swapaxes(x, 0, 1).reshape(num_chunks, b // num_chunks, *x.shape[3:])


def from_chunks(x: jax.Array, num_shards: int) -> jax.Array:
    """Inverse of to_chunks."""
    n, c = x.shape[:2]
    x = x.reshape(n, num_shards, c // num_shards, *x.shape[2:])
    return jnp.swapaxes(x, 0, 1).reshape(n * c, *x.shape[3:])


def loss_and_grads(
    model,
    params,
    batch,
    rng,
    loss_on_embeddings,
    chunk_size: int,
    num_shards: int,
    max_segments: int | None = None,
    frozen=None,
):
    """GradCache equivalent of value_and_grad(loss(encode(params | frozen, batch)), has_aux=True):
    gradients w.r.t. `params` only (`frozen`: top-level keys held fixed, e.g. LoRA's base towers).

    loss_on_embeddings(params, q, d, n) -> (loss, metrics); `params` is passed so a learnable
    temperature gets its gradient. chunk_size: rows per device per chunk (of texts; of packed
    rows for a packed batch, whose `max_segments` is the packer's).
    """
    frozen = frozen or {}
    chunks = {}
    for x in inputs(batch):
        rows = x.tokens.shape[0]
        per_shard = rows // num_shards
        if per_shard % chunk_size:
            raise BadValueError(
                f"GRAD_CACHE_CHUNK_SIZE={chunk_size} must divide the per-device rows of {x.name} ({per_shard} = "
                f"{rows} / {num_shards} devices)"
            )
        n = per_shard // chunk_size
        arrays = tuple(to_chunks(a, n, num_shards) for a in x.arrays())
        chunks[x.name] = (x.side, arrays, to_chunks(jnp.arange(rows), n, num_shards))

    def embed_chunk(p, side, arrays, index):
        return embed(model, p | frozen, arrays, side, rng, index, max_segments)

    held = jax.lax.stop_gradient(params)
    outputs = {}
    for name, (side, arrays, idx) in chunks.items():  # 1. embed without activations
        out = jax.lax.map(lambda x, side=side: embed_chunk(held, side, x[0], x[1]), (arrays, idx))
        outputs[name] = from_chunks(out, num_shards)

    # 2. loss and its gradient w.r.t. the encoder outputs (and any parameter the loss reads directly)
    def loss_on_outputs(p, outs):
        return loss_on_embeddings(p | frozen, *assemble(batch, outs))

    (loss, metrics), (grads, cotangents) = jax.value_and_grad(loss_on_outputs, argnums=(0, 1), has_aux=True)(
        params, outputs
    )

    for name, (side, arrays, idx) in chunks.items():  # 3. re-encode each chunk under vjp
        cot = to_chunks(cotangents[name], idx.shape[0], num_shards)

        def accumulate(total, x, side=side):
            arrays_c, idx_c, cot_c = x
            _, pull = jax.vjp(lambda p: embed_chunk(p, side, arrays_c, idx_c), params)
            return jax.tree_util.tree_map(jnp.add, total, pull(cot_c)[0]), None

        grads, _ = jax.lax.scan(accumulate, grads, (arrays, idx, cot))
    return (loss, metrics), grads
