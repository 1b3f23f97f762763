"""models/layout.py: the one description of each architecture's parameter tree."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from samtone_jax.core.errors import BadValueError
from samtone_jax.models import DualEncoder, T5Config, init_params
from samtone_jax.models.layout import ARCHITECTURES, layout

# Written out by hand (the checkpoints on disk and the exporters' folders depend on these names).
EXPECTED_KEYS = {
    "sde": {"encoder", "projection"},
    "ade": {"query_encoder", "document_encoder", "query_projection", "document_projection"},
    "ade_spl": {"query_encoder", "document_encoder", "projection"},
    "ade_lora": {"encoder", "query_adapter", "document_adapter", "projection"},
}
PLAIN = [a for a in ARCHITECTURES if not layout(a).needs_adapters]
TINY = T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32, num_layers=1)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_model_builds_the_tree_the_layout_describes(architecture):
    tree = layout(architecture)
    model = DualEncoder(TINY, architecture, projection_dim=8, lora_rank=2 if tree.needs_adapters else 0)
    params = nn.unbox(init_params(model, jax.random.PRNGKey(0)))
    parts = {*tree.tower_keys(), *tree.projection_keys(), *(tree.adapter_keys() if tree.needs_adapters else ())}
    assert set(params) == EXPECTED_KEYS[architecture] == parts
    towers, kernels = tree.split(params)
    assert kernels["query"].shape == kernels["document"].shape == (16, 8)
    # identical_tower_init: the document side starts equal to the query side
    for a, b in zip(
        jax.tree_util.tree_leaves(towers["query"]), jax.tree_util.tree_leaves(towers["document"]), strict=True
    ):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("architecture", PLAIN)
def test_assemble_gives_two_towers_their_own_arrays(architecture):
    tower = {"layer": {"kernel": np.ones((2, 2), np.float32)}}
    kernel = np.zeros((2, 3), np.float32)
    tree = layout(architecture)
    params = tree.assemble({"query": tower, "document": tower}, {"query": kernel, "document": kernel})
    assert set(params) == EXPECTED_KEYS[architecture]
    towers, kernels = tree.split(params)
    towers["query"]["layer"]["kernel"][0, 0] = 5.0
    kernels["query"][0, 0] = 7.0
    shared_tower, shared_projection = architecture == "sde", architecture != "ade"
    assert towers["document"]["layer"]["kernel"][0, 0] == (5.0 if shared_tower else 1.0)
    assert kernels["document"][0, 0] == (7.0 if shared_projection else 0.0)


def test_which_parts_only_one_side_reads():
    assert layout("ade").owned_by("document") == ("document_encoder", "document_projection")
    assert layout("ade_spl").owned_by("document") == ("document_encoder",)
    assert layout("sde").owned_by("query") == ()


def test_an_unknown_architecture_names_the_gin_setting_and_the_choices():
    with pytest.raises(BadValueError, match=r"DualEncoder.architecture='colbert'.*sde.*ade.*ade_spl"):
        layout("colbert")
