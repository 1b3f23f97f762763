"""The training input pipeline: a seqio task or mixture -> per-host batches of model features.

Data shards: the examples are split into `data_shards` shards (example i goes to shard i mod V);
host h of H owns shards [h·V/H, (h+1)·V/H) and tokenises, caches and shuffles only those, so a
host reads 1/H of the data. Each shard contributes B/V rows to every global batch, in shard
order, so the global batch is a function of (seed, V) alone: any host count that divides V sees
the same batches (set V explicitly to resume on a different number of hosts with the same data
order; the default V = H is the cheapest).

Order is a deterministic function of the seed: each shard's tokenised examples are cached in
memory and fully shuffled each epoch. The position in the stream is the number of batches
consumed, so a resumed run calls this with `start_batch=step` and sees exactly the batches it
would have seen (`.skip` replays the cheap shuffle/batch steps over the cached examples, not the
tokenisation).

`shuffle_block_size` k > 1 shuffles runs of k consecutive examples (in the task's order) instead
of single examples: examples of one document stay together, making duplicate-heavy batches (the
SamToNe same-tower ablation). It needs V = 1 (a run is consecutive in the whole task).
"""

from __future__ import annotations

import numpy as np
import seqio

from samtone_jax.core.errors import BadValueError
from samtone_jax.core.tensorflow_setup import tf
from samtone_jax.data import vocab as vocab_lib
from samtone_jax.data.features import DualEncoderFeatureConverter
from samtone_jax.data.input_spec import InputSpec


def train_dataset(
    name: str,
    split: str,
    spec: InputSpec,
    *,
    batch_size: int,
    seed: int = 0,
    shard_index: int = 0,
    num_shards: int = 1,
    data_shards: int | None = None,
    shuffle_block_size: int = 1,
    start_batch: int = 0,
) -> tf.data.Dataset:
    """Infinite dataset of batches {query_tokens [b, Lq], doc_tokens [b, Ld], ids, ...} for one host.

    `batch_size` is this host's share of the global batch; `shard_index` / `num_shards` are the host
    and host count; `data_shards` V (default num_shards) as in the module docstring. `spec` gives the
    lengths and the features every batch carries; the task is registered with the same spec
    (tasks/registration.register(spec)).
    """
    if batch_size <= 0:
        raise BadValueError(f"batch_size ({batch_size}) must be > 0")
    if not 0 <= shard_index < num_shards:
        raise BadValueError(f"shard_index {shard_index} must be in [0, {num_shards})")
    shards = data_shards or num_shards
    global_batch = batch_size * num_shards
    if shards % num_shards or global_batch % shards:
        raise BadValueError(
            f"inputs.data_shards={shards} must be a multiple of the {num_shards} host(s) and divide the global batch "
            f"{global_batch}"
        )
    if shuffle_block_size < 1 or (shuffle_block_size > 1 and shards != 1):
        raise BadValueError(
            f"inputs.shuffle_block_size={shuffle_block_size} must be >= 1, and > 1 needs inputs.data_shards=1 (a block "
            f"is a run of consecutive examples of the whole task); data_shards is {shards}"
        )
    provider = seqio.get_mixture_or_task(name)
    start_id, end_id = vocab_lib.special_ids(spec.vocabulary)
    converter = DualEncoderFeatureConverter(spec.num_negatives, spec.teacher_scores, spec.guide_ids, start_id, end_id)
    lengths = converter.task_feature_lengths(spec.query_length, spec.doc_length)
    per_shard = global_batch // shards
    owned = range(shard_index * shards // num_shards, (shard_index + 1) * shards // num_shards)
    streams = [
        _shard_batches(provider, converter, lengths, split, shard, shards, per_shard, seed, shuffle_block_size)
        for shard in owned
    ]
    if len(streams) == 1:
        ds = streams[0]
    else:
        ds = tf.data.Dataset.zip(tuple(streams)).map(
            lambda *parts: {k: tf.concat([p[k] for p in parts], axis=0) for k in parts[0]}
        )
    return ds.skip(start_batch).prefetch(tf.data.AUTOTUNE)


def _shard_batches(provider, converter, lengths, split, shard, shards, rows, seed, block):
    """Infinite batches of `rows` examples of data shard `shard` of `shards`."""
    info = seqio.ShardInfo(shard, shards) if shards > 1 else None
    shard_seed = seed if shards == 1 else seed * 1_000_003 + shard
    if isinstance(provider, seqio.Mixture):
        ds = provider.get_dataset(
            None,
            split,
            shuffle=True,
            seed=shard_seed,
            num_epochs=None,
            use_cached=False,
            shard_info=info,
            passthrough_features=[k for k in lengths if k not in ("query", "document")],
        )
        return converter(ds, lengths).batch(rows, drop_remainder=True)
    ds = provider.get_dataset(None, split, shuffle=False, num_epochs=1, use_cached=False, shard_info=info)
    ds = converter(ds, lengths).cache()
    count = int(ds.reduce(np.int64(0), lambda n, _: n + 1))
    where = f"task {provider.name}/{split}" + (f" data shard {shard} of {shards}" if shards > 1 else "")
    if count < max(rows, block):
        raise BadValueError(f"{where} has {count} examples, fewer than its {rows} rows of every global batch")
    if block > 1:
        ds = ds.batch(block, drop_remainder=True)
        ds = ds.shuffle(count // block, seed=shard_seed, reshuffle_each_iteration=True).unbatch()
    else:
        ds = ds.shuffle(count, seed=shard_seed, reshuffle_each_iteration=True)
    return ds.repeat().batch(rows, drop_remainder=True)
