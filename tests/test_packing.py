"""Packed rows (issue 19): several texts per row, each a contiguous run numbered by its segment id
(T5X's convention). Each text's packed embedding must equal its embedding alone and unpadded."""

from __future__ import annotations

import dataclasses
import types

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from samtone_jax.core.errors import BadValueError
from samtone_jax.models import BertConfig, DualEncoder, T5Config, init_params
from samtone_jax.models.layout import ARCHITECTURES, layout

LENGTH = 48  # distances up to 47: T5's exact and log-spaced buckets (and their boundaries)
TINY = T5Config(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48, num_layers=2)
TINY_BERT = BertConfig(vocab_size=64, emb_dim=32, num_heads=4, head_dim=8, mlp_dim=48, num_layers=2, max_length=64)
# Rows of text lengths, packed by hand: a text filling its row, a row of one text, rows of several
# texts of very different lengths, and one with free room at the end (padding).
ROWS = [[48], [3, 7, 1], [5], [2, 9, 4], [30, 17]]


def _texts(seed=0):
    rng = np.random.default_rng(seed)
    return [[list(rng.integers(2, 64, size=n - 1)) + [1] for n in row] for row in ROWS]  # EOS-terminated


def _pack(rows):
    """(tokens, segment_ids) [R, LENGTH], written out independently of the packer."""
    tokens, segments = (np.zeros((len(rows), LENGTH), np.int32) for _ in range(2))
    for r, row in enumerate(rows):
        at = 0
        for s, text in enumerate(row):
            tokens[r, at : at + len(text)] = text
            segments[r, at : at + len(text)] = s + 1
            at += len(text)
    return tokens, segments


@pytest.mark.parametrize(
    "architecture", [a if a == "sde" else pytest.param(a, marks=pytest.mark.slow) for a in ARCHITECTURES]
)
@pytest.mark.parametrize("layers", ["unrolled", "scanned+remat"])
def test_packed_embeddings_equal_each_text_alone(architecture, layers):
    config = TINY if layers == "unrolled" else dataclasses.replace(TINY, scan_layers=True, remat=True)
    adapted = layout(architecture).needs_adapters  # ade_lora: its adapters moved off zero, so they act
    model = DualEncoder(config, architecture, projection_dim=16, identical_tower_init=False, lora_rank=2 * adapted)
    params = {"params": nn.unbox(init_params(model, jax.random.PRNGKey(1)))}
    if adapted:
        params = jax.tree_util.tree_map_with_path(lambda path, x: x + 0.3 if path[-1].key == "b" else x, params)
    rows = _texts()
    tokens, segments = _pack(rows)
    slots = max(len(r) for r in rows)
    # Each text alone in its own row (padding after it changes nothing: test_dual_encoder's
    # test_padding_does_not_change_embeddings; the 48-token text fills its row, unpadded).
    texts = [text for row in rows for text in row]
    alone_rows = np.zeros((len(texts), LENGTH), np.int32)
    for i, text in enumerate(texts):
        alone_rows[i, : len(text)] = text
    for side, method in (("query", model.encode_queries), ("document", model.encode_documents)):
        packed = jax.jit(lambda p, t, s, side=side: model.apply(p, t, s, side, slots, method=model.encode_packed))(
            params, tokens, segments
        )
        alone = jax.jit(lambda p, t, m=method: model.apply(p, t, method=m))(params, alone_rows)
        assert packed.shape == (len(rows), slots, 16)
        i = 0
        for r, row in enumerate(rows):
            for s in range(len(row)):
                np.testing.assert_allclose(packed[r, s], alone[i], rtol=1e-5, atol=2e-6, err_msg=f"{side} {r},{s}")
                i += 1
            np.testing.assert_array_equal(packed[r, len(row) :], 0.0)  # unused slots are zeros


def test_a_packed_text_ignores_its_neighbours():
    """Changing one text of a row leaves the other texts' embeddings exactly as they were."""
    model = DualEncoder(TINY, "sde", projection_dim=16)
    params = {"params": nn.unbox(init_params(model, jax.random.PRNGKey(2)))}
    rows = _texts()
    changed = [list(r) for r in rows]
    changed[1] = [rows[1][0], [5] * 6 + [1], rows[1][2]]  # the middle text of row 1
    packed = jax.jit(lambda p, t, s: model.apply(p, t, s, "query", 3, method=model.encode_packed))
    embed = [packed(params, *_pack(x))[1] for x in (rows, changed)]
    np.testing.assert_allclose(embed[0][np.array([0, 2])], embed[1][np.array([0, 2])], rtol=1e-6, atol=1e-7)
    assert np.abs(embed[0][1] - embed[1][1]).max() > 1e-3


# The packer (samtone_jax/data/packing.py).


def _padded(rng, n, length, max_real):
    """[n, length] zero-padded EOS-terminated texts of 1..max_real tokens."""
    out = np.zeros((n, length), np.int32)
    for i in range(n):
        real = int(rng.integers(1, max_real + 1))
        out[i, : real - 1], out[i, real - 1] = rng.integers(2, 64, size=real - 1), 1
    return out


def _batch(seed=0, b=32, k=0, lq=12, ld=20, short=None):
    """Zero-padded texts of random lengths; `short`: queries of at most that many tokens."""
    rng = np.random.default_rng(seed)
    batch = {
        "query_tokens": _padded(rng, b, lq, short or lq),
        "doc_tokens": _padded(rng, b, ld, ld),
        "query_id": np.arange(b, dtype=np.int32),
        "doc_id": np.arange(b, dtype=np.int32) + 100,
    }
    if k:
        batch["negative_tokens"] = _padded(rng, b * k, ld, ld).reshape(b, k, ld)
        batch["negative_ids"] = np.arange(b * k, dtype=np.int32).reshape(b, k) + 1000
    return batch


def _read(packed, prefix, slot, max_segments):
    """The text at a flat slot, read back from the packed rows."""
    row, index = divmod(int(slot), max_segments)
    return packed[f"{prefix}_tokens"][row][packed[f"{prefix}_segment_ids"][row] == index + 1]


def _real(text):
    return text[: np.flatnonzero(text)[-1] + 1] if text.any() else text[:0]


@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.parametrize("devices", [1, 4])
def test_the_packer_keeps_every_text_whole_and_on_its_own_devices_rows(k, devices):
    from samtone_jax.data.packing import pack_batch

    batch = _batch(k=k)
    batch["query_tokens"][5] = 0  # an empty text: a slot of no tokens (it embeds to zeros, as unpacked)
    packed = pack_batch(batch, devices=devices, max_segments=3, row_multiple=2)
    for key in ("query_id", "doc_id", *(("negative_ids",) if k else ())):
        np.testing.assert_array_equal(packed[key], batch[key])  # the pairs and their order are the batch's
    rows_q, rows_d = packed["query_tokens"].shape[0], packed["doc_tokens"].shape[0]
    assert rows_q % (2 * devices) == 0 and rows_d % (2 * devices) == 0
    assert packed["query_segment_ids"].max() <= 3 and packed["doc_segment_ids"].max() <= 3
    per = 32 // devices
    for i in range(32):
        device = i // per
        for prefix, slot, text, rows in (
            ("query", packed["query_slot"][i], batch["query_tokens"][i], rows_q),
            ("doc", packed["doc_slot"][i], batch["doc_tokens"][i], rows_d),
            *[("doc", packed["negative_slot"][i, n], batch["negative_tokens"][i, n], rows_d) for n in range(k)],
        ):
            np.testing.assert_array_equal(_read(packed, prefix, slot, 3), _real(text))
            row = int(slot) // 3
            assert device * rows // devices <= row < (device + 1) * rows // devices  # its device's block
            in_text = np.flatnonzero(packed[f"{prefix}_segment_ids"][row] == int(slot) % 3 + 1)
            assert np.all(np.diff(in_text) == 1)  # one contiguous run: the encoder relies on it
    slots = np.concatenate([packed["doc_slot"], packed["negative_slot"].ravel()] if k else [packed["doc_slot"]])
    assert len(set(slots.tolist())) == len(slots) and len(set(packed["query_slot"].tolist())) == 32


def test_packed_rows_are_mostly_real_tokens():
    from samtone_jax.data.packing import pack_batch

    batch = _batch(seed=5, b=256, lq=32, ld=48, short=16)  # queries of ≤ 16 tokens of 32, as on real data
    a = pack_batch(batch, 1, max_segments=8, row_bits=16)  # the rows first-fit decreasing needs, unrounded
    for prefix in ("query", "doc"):
        real = (a[f"{prefix}_segment_ids"] > 0).mean()
        unpacked = (batch[f"{prefix}_tokens"] > 0).mean()
        assert real > 0.95 and real > unpacked, (prefix, real, unpacked)  # first-fit decreasing fills rows


def test_a_text_longer_than_its_row_or_a_bad_budget_is_named():
    from samtone_jax.core.errors import BadValueError
    from samtone_jax.data.packing import assign_rows, pack_batch

    with pytest.raises(BadValueError, match=r"a text of 13 tokens is longer than its row \(12\)"):
        assign_rows(np.array([3, 13]), 12, 4)
    with pytest.raises(BadValueError, match="a batch of 32 pairs does not split over 3 devices"):
        pack_batch(_batch(), devices=3, max_segments=4)
    with pytest.raises(BadValueError, match="max_segments"):
        pack_batch(_batch(), devices=1, max_segments=0)
    with pytest.raises(BadValueError, match=r"row_bits \(0\)"):
        pack_batch(_batch(), devices=1, max_segments=4, row_bits=0)


def test_row_counts_round_to_their_first_bits_then_to_the_multiple():
    from samtone_jax.data.packing import round_rows

    cases = {(7, 3): 7, (8, 3): 8, (9, 3): 10, (13, 3): 14, (16, 3): 16, (17, 3): 20, (33, 3): 40, (65, 3): 80}
    cases.update({(17, 4): 18, (5, 1): 8, (1, 1): 1, (13, 16): 13})
    assert {key: round_rows(*key) for key in cases} == cases
    assert round_rows(13, 3, multiple=4) == 16 and round_rows(7, 3, multiple=2) == 8


def test_a_row_floor_from_the_first_batches_bounds_the_shapes_and_keeps_every_text():
    """packing.row_sample: the most rows the first batches need is a floor for every later
    batch, so later batches stop bringing new shapes (each a compilation); texts stay where the slots say."""
    from samtone_jax.data.packing import pack_batch, rows_needed
    from samtone_jax.training.train_batches import Packing

    mesh = types.SimpleNamespace(shape={"data": 2})
    batches = [_batch(seed=s, b=64, lq=32, ld=48, short=20) for s in range(60)]
    unrounded = pack_batch(batches[0], 2, max_segments=8, row_bits=16)
    assert rows_needed(batches[0], 2, 8) == (
        unrounded["query_tokens"].shape[0] // 2,
        unrounded["doc_tokens"].shape[0] // 2,
    )
    packing = Packing(max_segments=8, row_bits=3, row_sample=20)
    floor = packing.row_floor(mesh, batches[:20])
    assert floor == tuple(max(rows_needed(b, 2, 8)[i] for b in batches[:20]) for i in (0, 1))
    shapes = lambda pack: {(p["query_tokens"].shape, p["doc_tokens"].shape) for p in map(pack, batches[20:])}
    free, floored = shapes(packing.packer(mesh, None)), shapes(packing.packer(mesh, None, floor))
    assert len(free) >= 3 and len(floored) < len(free), (free, floored)
    packed = packing.packer(mesh, None, floor)(batches[30])
    assert packed["query_tokens"].shape[0] >= 2 * floor[0] and packed["doc_tokens"].shape[0] >= 2 * floor[1]
    for i in range(64):
        np.testing.assert_array_equal(
            _read(packed, "query", packed["query_slot"][i], 8), _real(batches[30]["query_tokens"][i])
        )
        np.testing.assert_array_equal(
            _read(packed, "doc", packed["doc_slot"][i], 8), _real(batches[30]["doc_tokens"][i])
        )
    with pytest.raises(BadValueError, match="packing.row_sample = -1"):
        Packing(row_sample=-1)


# The packed train step (train.make_train_step with a packed batch).


def _step(model, mesh, batch, chunk=None, max_segments=None):
    """(parameters after one SGD step of rate 1 from the initial state = params − gradient, metrics):
    comparing them compares the gradients themselves."""
    from samtone_jax.config import gin_config
    from samtone_jax.models import partitioning
    from samtone_jax.training import train

    tx = optax.sgd(1.0)
    state = train.initial_state(model, tx, mesh, seed=0, init_checkpoint=None)
    step = train.make_train_step(model, tx, lambda _: 1.0, mesh, chunk, gin_config.contrastive_loss, max_segments)
    step = jax.jit(step)
    new_state, metrics = step(state, partitioning.host_to_global(mesh, batch))
    return jax.device_get(new_state["params"]), jax.device_get(metrics)


def _assert_same_step(a, b, what):
    (params_a, metrics_a), (params_b, metrics_b) = a, b
    for key in ("loss", "accuracy", "positive_similarity", "masked_fraction", "grad_norm"):
        np.testing.assert_allclose(metrics_a[key], metrics_b[key], rtol=2e-5, err_msg=f"{key}: {what}")
    for x, y in zip(jax.tree_util.tree_leaves(params_a), jax.tree_util.tree_leaves(params_b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6, err_msg=what)


@pytest.fixture
def gin_samtone():
    from samtone_jax.cli import gin_registry

    gin_registry.parse(["losses/samtone_both.gin"], ["TEMPERATURE = 0.05"])
    yield
    gin_registry.parse([], [])


@pytest.mark.slow
@pytest.mark.parametrize("tower", ["t5", "bert"])
def test_the_packed_step_equals_the_unpacked_step_sharded_and_with_grad_cache(gin_samtone, tower):
    """Same pairs, packed on 8 devices (plain and GradCache) vs unpacked on one: the same loss,
    metrics and updated parameters (dropout off: packed rows draw their masks per row); T5 and BERT
    towers (BERT's absolute positions restart in every packed text)."""
    from samtone_jax.data.packing import pack_batch
    from samtone_jax.models import partitioning
    from samtone_jax.training import train_batches

    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    config = TINY if tower == "t5" else TINY_BERT
    model = DualEncoder(config, "ade_spl", projection_dim=16, identical_tower_init=False)
    raw = _batch(seed=7, b=64, k=2, short=5)
    batch = train_batches.model_features(dict(raw, query_id=np.arange(64) % 40))  # duplicates, to be masked
    packed = pack_batch(batch, devices=8, max_segments=4, row_multiple=2)
    assert packed["query_tokens"].shape[0] < 64 and packed["doc_tokens"].shape[0] < 64 * 3  # fewer rows than texts
    one = partitioning.create_mesh(devices=jax.devices()[:1])
    reference = _step(model, one, batch)
    assert reference[1]["masked_fraction"] > 0
    eight = partitioning.create_mesh()
    _assert_same_step(_step(model, eight, packed, max_segments=4), reference, "packed on 8 devices")
    _assert_same_step(_step(model, eight, packed, chunk=1, max_segments=4), reference, "packed + GradCache")
    # Dropout on: GradCache re-draws each packed row's mask from its row index, as the plain step.
    dropout = model.clone(config=dataclasses.replace(config, dropout_rate=0.2))
    plain = _step(dropout, eight, packed, max_segments=4)
    _assert_same_step(_step(dropout, eight, packed, chunk=1, max_segments=4), plain, "dropout, GradCache")
    assert abs(plain[1]["loss"] - reference[1]["loss"]) > 1e-4  # the masks are really on


def test_hosts_packing_their_own_pairs_build_the_one_hosts_global_batch():
    """Two hosts of two devices, each packing its half with the agreed row counts, give exactly the
    arrays one host of four devices packs (slots count from each host's first global row)."""
    from samtone_jax.data.packing import pack_batch

    batch = _batch(seed=9, b=32, k=1)
    whole = pack_batch(batch, devices=4, max_segments=3, row_multiple=2)
    agreed = (whole["query_tokens"].shape[0] // 4, whole["doc_tokens"].shape[0] // 4)
    halves = [
        pack_batch(
            {k: v[h * 16 : (h + 1) * 16] for k, v in batch.items()},
            2,
            3,
            row_multiple=2,
            agree=lambda _: agreed,
            host_index=h,
        )
        for h in (0, 1)
    ]
    for key in whole:
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), whole[key], err_msg=key)
