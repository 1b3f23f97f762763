"""Packed rows (issue 19): several texts per row, segment ids and per-segment positions (T5X's
convention). Each text's packed embedding must equal its embedding alone and unpadded."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from samtone_jax.models import DualEncoder, T5Config, init_params
from samtone_jax.models.layout import ARCHITECTURES

LENGTH = 16
TINY = T5Config(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48, num_layers=2)
# Rows of text lengths, packed by hand: a text filling its row, a row of one text, rows of several
# texts of very different lengths, and one with free room at the end (padding).
ROWS = [[16], [3, 7, 1], [5], [2, 9, 4]]


def _texts(seed=0):
    rng = np.random.default_rng(seed)
    return [[list(rng.integers(2, 64, size=n - 1)) + [1] for n in row] for row in ROWS]  # EOS-terminated


def _pack(rows):
    """(tokens, segment_ids, positions) [R, LENGTH], written out independently of the packer."""
    tokens, segments, positions = (np.zeros((len(rows), LENGTH), np.int32) for _ in range(3))
    for r, row in enumerate(rows):
        at = 0
        for s, text in enumerate(row):
            tokens[r, at : at + len(text)] = text
            segments[r, at : at + len(text)] = s + 1
            positions[r, at : at + len(text)] = np.arange(len(text))
            at += len(text)
    return tokens, segments, positions


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("layers", ["unrolled", "scanned+remat"])
def test_packed_embeddings_equal_each_text_alone(architecture, layers):
    config = TINY if layers == "unrolled" else dataclasses.replace(TINY, scan_layers=True, remat=True)
    model = DualEncoder(config, architecture, projection_dim=16, identical_tower_init=False)
    params = {"params": nn.unbox(init_params(model, jax.random.PRNGKey(1)))}
    rows = _texts()
    tokens, segments, positions = _pack(rows)
    slots = max(len(r) for r in rows)
    for side, method in (("query", model.encode_queries), ("document", model.encode_documents)):
        packed = model.apply(params, tokens, segments, positions, side, slots, method=model.encode_packed)
        assert packed.shape == (len(rows), slots, 16)
        for r, row in enumerate(rows):
            for s, text in enumerate(row):
                alone = model.apply(params, jnp.asarray([text], jnp.int32), method=method)[0]
                np.testing.assert_allclose(packed[r, s], alone, rtol=1e-5, atol=2e-6, err_msg=f"{side} {r},{s}")
            np.testing.assert_array_equal(packed[r, len(row) :], 0.0)  # unused slots are zeros


def test_a_packed_text_ignores_its_neighbours():
    """Changing one text of a row leaves the other texts' embeddings exactly as they were."""
    model = DualEncoder(TINY, "sde", projection_dim=16)
    params = {"params": nn.unbox(init_params(model, jax.random.PRNGKey(2)))}
    rows = _texts()
    changed = [list(r) for r in rows]
    changed[1] = [rows[1][0], [5] * 6 + [1], rows[1][2]]  # the middle text of row 1
    embed = [model.apply(params, *_pack(x), "query", 3, method=model.encode_packed)[1] for x in (rows, changed)]
    np.testing.assert_allclose(embed[0][np.array([0, 2])], embed[1][np.array([0, 2])], rtol=1e-6, atol=1e-7)
    assert np.abs(embed[0][1] - embed[1][1]).max() > 1e-3


# The packer (samtone_jax/data/packing.py).


def _stream(n, seed=0, k=0, max_q=12, max_d=20):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ex = {
            "query_tokens": np.r_[rng.integers(2, 64, size=rng.integers(0, max_q)), 1].astype(np.int32),
            "doc_tokens": np.r_[rng.integers(2, 64, size=rng.integers(0, max_d)), 1].astype(np.int32),
            "query_id": 1000 + i,
            "doc_id": 5000 + i,
        }
        if k:
            ex["negative_tokens"] = [np.r_[rng.integers(2, 64, size=rng.integers(0, max_d)), 1] for _ in range(k)]
            ex["negative_ids"] = np.arange(k) + 9000 + 10 * i
        out.append(ex)
    return out


def _unpack(tokens, segments, slot, max_segments):
    """The text at a flat slot, read back from the packed rows."""
    row, index = divmod(int(slot), max_segments)
    return tokens[row][segments[row] == index + 1]


@pytest.mark.parametrize("k", [0, 2])
def test_the_packer_keeps_every_pair_in_order_and_its_texts_whole(k):
    from samtone_jax.data.packing import PackingBudget, pack_pairs

    budget = PackingBudget(
        16, query_rows=5, query_length=12, doc_rows=8, doc_length=20, max_segments=4, num_negatives=k
    )
    stream = _stream(200, k=k)
    seen = []
    for batch, position in pack_pairs(stream, budget):
        assert batch["query_tokens"].shape == (5, 12) and batch["doc_positions"].shape == (8, 20)
        assert batch["query_slot"].shape == (16,) and batch["pair_mask"].shape == (16,)
        pairs = int(batch["pair_mask"].sum())
        assert pairs >= 1 and batch["pair_mask"][:pairs].all() and not batch["pair_mask"][pairs:].any()
        assert (batch["query_id"][pairs:] == -1).all()
        for seg in (batch["query_segment_ids"], batch["doc_segment_ids"]):
            assert seg.max() <= 4
        for i in range(pairs):
            j = len(seen)
            assert batch["query_id"][i] == stream[j]["query_id"] and batch["doc_id"][i] == stream[j]["doc_id"]
            q = _unpack(batch["query_tokens"], batch["query_segment_ids"], batch["query_slot"][i], 4)
            np.testing.assert_array_equal(q, stream[j]["query_tokens"])
            d = _unpack(batch["doc_tokens"], batch["doc_segment_ids"], batch["doc_slot"][i], 4)
            np.testing.assert_array_equal(d, stream[j]["doc_tokens"])
            for n in range(k):
                neg = _unpack(batch["doc_tokens"], batch["doc_segment_ids"], batch["negative_slot"][i, n], 4)
                np.testing.assert_array_equal(neg, stream[j]["negative_tokens"][n])
            # positions count from 0 within each text
            row, index = divmod(int(batch["query_slot"][i]), 4)
            in_text = batch["query_segment_ids"][row] == index + 1
            np.testing.assert_array_equal(batch["query_positions"][row][in_text], np.arange(in_text.sum()))
            seen.append(j)
        assert position == len(seen)
    assert seen == list(range(200))  # every pair once, in stream order


def test_the_packer_resumes_from_a_stream_position_with_the_same_batches():
    from samtone_jax.data.packing import PackingBudget, pack_pairs

    budget = PackingBudget(max_pairs=32, query_rows=6, query_length=12, doc_rows=10, doc_length=20, max_segments=4)
    stream = _stream(300, seed=3)
    straight = list(pack_pairs(stream, budget))
    position = straight[3][1]
    resumed = list(pack_pairs(stream[position:], budget, start=position))
    assert len(resumed) == len(straight) - 4
    for (a, pa), (b, pb) in zip(straight[4:], resumed, strict=True):
        assert pa == pb and a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_packed_rows_are_mostly_real_tokens_and_the_pair_limit_holds():
    from samtone_jax.data.packing import PackingBudget, pack_pairs

    budget = PackingBudget(max_pairs=64, query_rows=24, query_length=32, doc_rows=24, doc_length=48, max_segments=8)
    batches = [b for b, _ in pack_pairs(_stream(2000, seed=4, max_q=20, max_d=30), budget)][:-1]  # the last: a tail
    real = [(b["query_segment_ids"] > 0).mean() for b in batches] + [(b["doc_segment_ids"] > 0).mean() for b in batches]
    assert np.mean(real) > 0.5  # whichever side closes the batch is nearly full
    assert max(max((b["query_segment_ids"] > 0).mean(), (b["doc_segment_ids"] > 0).mean()) for b in batches) > 0.9
    assert all(b["pair_mask"].sum() <= 64 for b in batches)


def test_a_pair_that_cannot_fit_an_empty_batch_names_the_budget():
    from samtone_jax.data.packing import PackingBudget, pack_pairs
    from samtone_jax.errors import BadValueError

    budget = PackingBudget(4, query_rows=1, query_length=12, doc_rows=2, doc_length=4, max_segments=2, num_negatives=2)
    three = np.array([5, 6, 1], np.int32)
    pair = dict(_stream(1)[0], doc_tokens=three, negative_tokens=[three, three], negative_ids=np.array([7, 8]))
    with pytest.raises(BadValueError, match=r"stream position 0: one pair .*2 × 4 document tokens, 2 texts a row"):
        list(pack_pairs([pair], budget))
    long = [dict(_stream(1)[0], query_tokens=np.ones(13, np.int32))]
    with pytest.raises(BadValueError, match="query_tokens of 13 tokens is longer than its row \\(12\\)"):
        list(pack_pairs(long, dataclasses.replace(budget, num_negatives=0)))
