"""The training input pipeline: a seqio task or mixture -> per-host batches of model features.

Order is a deterministic function of the seed: a task's tokenised examples are cached in
memory, fully shuffled each epoch from the seed, and batched into global batches of which host h
(`shard_index` of `num_shards`) keeps rows [h·b, (h+1)·b).
The position in the stream is the number of batches consumed, so a resumed run calls this with
`start_batch=step` and sees exactly the batches it would have seen (`.skip` replays the cheap
shuffle/batch steps over the cached examples, not the tokenisation).
"""

from __future__ import annotations

import numpy as np
import seqio
import tensorflow as tf

from samtone_jax.data.features import EOS_ID, DualEncoderFeatureConverter


def train_dataset(
    name: str,
    split: str,
    *,
    batch_size: int,
    query_length: int,
    doc_length: int,
    seed: int = 0,
    num_negatives: int = 0,
    shard_index: int = 0,
    num_shards: int = 1,
    start_batch: int = 0,
) -> tf.data.Dataset:
    """Infinite dataset of batches {query_tokens [b, Lq], doc_tokens [b, Ld], ids, ...} for one host.

    `batch_size` is this host's share of the global batch.
    """
    if batch_size <= 0 or query_length < 2 or doc_length < 2:
        raise ValueError(f"batch_size ({batch_size}) must be > 0 and lengths ({query_length}, {doc_length}) >= 2")
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index {shard_index} must be in [0, {num_shards})")
    provider = seqio.get_mixture_or_task(name)
    converter = DualEncoderFeatureConverter(num_negatives)
    lengths = converter.task_feature_lengths(query_length, doc_length)
    if isinstance(provider, seqio.Mixture):
        ds = provider.get_dataset(
            None, split, shuffle=True, seed=seed, num_epochs=None, use_cached=False,
            passthrough_features=[k for k in lengths if k not in ("query", "document")],
        )  # fmt: skip
        ds = converter(ds, lengths)
    else:
        ds = provider.get_dataset(None, split, shuffle=False, num_epochs=1, use_cached=False)
        ds = converter(ds, lengths).cache()
        count = int(ds.reduce(np.int64(0), lambda n, _: n + 1))
        if count < batch_size * num_shards:
            raise ValueError(
                f"task {name}/{split} has {count} examples, fewer than one global batch ({batch_size} x {num_shards})"
            )
        ds = ds.shuffle(count, seed=seed, reshuffle_each_iteration=True).repeat()
    # Every host forms the same global batch and keeps its contiguous block of rows, so the global
    # batch (rows in order) is identical whatever the number of hosts.
    ds = ds.batch(batch_size * num_shards, drop_remainder=True).skip(start_batch)
    if num_shards > 1:
        lo, hi = shard_index * batch_size, (shard_index + 1) * batch_size
        ds = ds.map(lambda batch: {k: v[lo:hi] for k, v in batch.items()})
    return ds.prefetch(tf.data.AUTOTUNE)


def encode_texts(vocabulary, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokenise texts for encoding (corpus, queries): ([N, length] int32, [N] truncated 0/1)."""
    if not texts:
        return np.zeros((0, length), np.int32), np.zeros((0,), np.int32)
    ragged = vocabulary.encode_tf(tf.constant(texts))
    sizes = ragged.row_lengths().numpy()
    kept = ragged[:, : length - 1].to_tensor(shape=[len(texts), length - 1]).numpy()
    tokens = np.concatenate([kept, np.zeros((len(texts), 1), np.int32)], axis=1).astype(np.int32)
    tokens[np.arange(len(texts)), np.minimum(sizes, length - 1)] = EOS_ID  # EOS after the kept ids
    return tokens, (sizes >= length).astype(np.int32)
