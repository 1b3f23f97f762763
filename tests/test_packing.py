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
