"""SDE / ADE / ADE-SPL: parameter sharing, pooling, normalisation, partitioning names."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from samtone_jax.models import DualEncoder, T5Config, T5Encoder, init_params
from samtone_jax.models.partitioning import param_partition_specs


def _tokens(seed, batch=3, length=9, vocab=97):
    rng = np.random.RandomState(seed)
    ids = rng.randint(1, vocab, size=(batch, length))
    ids[0, 5:] = 0
    return jnp.asarray(ids)


def _setup(config, architecture):
    model = DualEncoder(config, architecture=architecture, projection_dim=16)
    params = nn.unbox(init_params(model, jax.random.PRNGKey(0)))
    return model, params


def _apply(model, params, *args, method=None, **kwargs):
    """model.apply({"params": params}, *args) compiled as one program (eager, every op compiles on
    its own: a tiny tower's forward 3.0 s against 0.6 s, its gradient 7.1 s against 1.3 s here)."""
    return jax.jit(lambda p, *a: model.apply({"params": p}, *a, method=method, **kwargs))(params, *args)


def _leaf_count(tree):
    return len(jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize(
    "architecture,keys",
    [
        ("sde", {"encoder", "projection"}),
        ("ade", {"query_encoder", "document_encoder", "query_projection", "document_projection"}),
        ("ade_spl", {"query_encoder", "document_encoder", "projection"}),
    ],
)
def test_parameter_trees_share_what_they_claim(tiny_config, architecture, keys):
    model, params = _setup(tiny_config, architecture)
    assert set(params) == keys
    tower = _leaf_count(params.get("encoder", params.get("query_encoder")))
    towers = 1 if architecture == "sde" else 2
    projections = 2 if architecture == "ade" else 1
    assert _leaf_count(params) == towers * tower + projections  # a shared leaf is one leaf


def _grads(model, params, side):
    """Gradient of a loss that depends only on the queries (or only on the documents)."""
    q_tokens, d_tokens = _tokens(1), _tokens(2)

    def loss(p):
        q, d, _ = model.apply({"params": p}, q_tokens, d_tokens)
        target = q if side == "query" else d
        return jnp.sum(target * jnp.arange(target.shape[-1]))

    return jax.jit(jax.grad(loss))(params)


def _norm(tree):
    return float(sum(jnp.sum(jnp.abs(x)) for x in jax.tree_util.tree_leaves(tree)))


def test_sde_one_tower_serves_both_sides(tiny_config):
    model, params = _setup(tiny_config, "sde")
    ids = _tokens(3)
    q = _apply(model, params, ids, method=model.encode_queries)
    d = _apply(model, params, ids, method=model.encode_documents)
    np.testing.assert_array_equal(np.asarray(q), np.asarray(d))
    assert _norm(_grads(model, params, "query")["encoder"]) > 0
    assert _norm(_grads(model, params, "document")["encoder"]) > 0


def test_ade_towers_are_independent(tiny_config):
    model, params = _setup(tiny_config, "ade")
    g = _grads(model, params, "query")
    assert _norm(g["query_encoder"]) > 0 and _norm(g["query_projection"]) > 0
    assert _norm(g["document_encoder"]) == 0 and _norm(g["document_projection"]) == 0


@pytest.mark.parametrize("architecture", ["ade", "ade_spl"])
def test_two_towers_start_equal_unless_asked_not_to(tiny_config, architecture):
    model, params = _setup(tiny_config, architecture)
    ids = _tokens(3)
    q = _apply(model, params, ids, method=model.encode_queries)
    d = _apply(model, params, ids, method=model.encode_documents)
    np.testing.assert_array_equal(np.asarray(q), np.asarray(d))  # as if both loaded one checkpoint
    independent = dataclasses.replace(model, identical_tower_init=False)
    params = nn.unbox(init_params(independent, jax.random.PRNGKey(0)))
    q = _apply(independent, params, ids, method=independent.encode_queries)
    d = _apply(independent, params, ids, method=independent.encode_documents)
    assert float(jnp.max(jnp.abs(q - d))) > 1e-2


def test_ade_spl_projection_gets_gradients_from_both_towers(tiny_config):
    model, params = _setup(tiny_config, "ade_spl")
    gq, gd = _grads(model, params, "query"), _grads(model, params, "document")
    assert _norm(gq["projection"]) > 0 and _norm(gd["projection"]) > 0
    assert _norm(gq["document_encoder"]) == 0 and _norm(gd["query_encoder"]) == 0
    # Both sides at once: the shared projection's gradient is the sum of the two.
    q_tokens, d_tokens = _tokens(1), _tokens(2)

    def both(p):
        q, d, _ = model.apply({"params": p}, q_tokens, d_tokens)
        w = jnp.arange(q.shape[-1])
        return jnp.sum(q * w) + jnp.sum(d * w)

    total = jax.jit(jax.grad(both))(params)["projection"]["kernel"]
    np.testing.assert_allclose(total, gq["projection"]["kernel"] + gd["projection"]["kernel"], rtol=1e-5, atol=1e-7)


def test_padding_does_not_change_embeddings(tiny_config):
    model, params = _setup(tiny_config, "sde")
    ids = _tokens(4, length=7)
    padded = jnp.concatenate([ids, jnp.zeros((3, 20), ids.dtype)], axis=1)
    a = _apply(model, params, ids, method=model.encode_queries)
    b = _apply(model, params, padded, method=model.encode_queries)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_embeddings_are_unit_norm_and_empty_text_is_zero(tiny_config):
    model, params = _setup(tiny_config, "ade_spl")
    ids = _tokens(5).at[2].set(0)  # an all-padding row
    emb = np.asarray(_apply(model, params, ids, method=model.encode_documents))
    assert emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb[:2], axis=1), 1.0, rtol=1e-6)
    # An empty text has no tokens to average: it pools to zero and stays zero (no NaN).
    np.testing.assert_array_equal(emb[2], 0.0)


@pytest.mark.slow
def test_negatives_are_encoded_by_the_document_tower(tiny_config):
    model, params = _setup(tiny_config, "ade")
    q, d = _tokens(6, batch=2), _tokens(7, batch=2)
    negatives = jnp.stack([_tokens(8, batch=2), _tokens(9, batch=2)], axis=1)  # [B=2, K=2, L]
    _, _, n = _apply(model, params, q, d, negatives)
    assert n.shape == (2, 2, 16)
    flat = _apply(model, params, negatives.reshape(4, -1), method=model.encode_documents)
    np.testing.assert_allclose(np.asarray(n).reshape(4, 16), np.asarray(flat), atol=1e-6)


def test_bfloat16_activations_stay_close_to_float32(tiny_config):
    model, params = _setup(tiny_config, "sde")
    bf16 = DualEncoder(dataclasses.replace(tiny_config, dtype="bfloat16"), projection_dim=16)
    ids = _tokens(10)
    a = np.asarray(_apply(model, params, ids, method=model.encode_queries))
    b = np.asarray(_apply(bf16, params, ids, method=bf16.encode_queries))
    assert b.dtype == np.float32 and np.all(np.isfinite(b))
    assert np.min(np.sum(a * b, axis=1)) > 0.99  # cosine between the two precisions


def test_dropout_is_active_only_when_not_deterministic(tiny_config):
    model, params = _setup(dataclasses.replace(tiny_config, dropout_rate=0.3), "sde")
    ids = _tokens(11)
    det = _apply(model, params, ids, method=model.encode_queries)
    det2 = _apply(model, params, ids, method=model.encode_queries)
    np.testing.assert_array_equal(np.asarray(det), np.asarray(det2))
    train = _apply(
        model, params, ids, method=model.encode_queries, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)}
    )
    assert np.abs(np.asarray(train) - np.asarray(det)).max() > 1e-3


def test_every_parameter_has_logical_axis_names(tiny_config):
    model = DualEncoder(tiny_config, architecture="ade", projection_dim=16)
    boxed = init_params(model, jax.random.PRNGKey(0))
    leaves = jax.tree_util.tree_leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert leaves and all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
    for leaf in leaves:
        assert len(leaf.names) == leaf.value.ndim and all(isinstance(n, str) for n in leaf.names)
    specs = param_partition_specs(boxed)
    q = specs["query_encoder"]["layers_0"]["attention"]["query"]
    assert tuple(q) == (None, "model", None)  # heads split over the model axis
    assert tuple(specs["query_encoder"]["layers_0"]["mlp"]["wi_0"]) == (None, "model")


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="DualEncoder.architecture='two_tower'"):
        cfg = T5Config(vocab_size=10, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=8, num_layers=1)
        DualEncoder(cfg, architecture="two_tower").init(
            jax.random.PRNGKey(0), jnp.ones((1, 3), jnp.int32), jnp.ones((1, 3), jnp.int32)
        )
    with pytest.raises(ValueError, match="mlp_activations"):
        T5Config(mlp_activations=("swish",))
    with pytest.raises(ValueError, match="T5Config.num_layers"):
        T5Config(num_layers=0)
    with pytest.raises(ValueError, match=r"token ids \[batch, length\]"):
        from samtone_jax.models import T5Encoder

        T5Encoder(T5Config(vocab_size=10, emb_dim=8, num_heads=2, head_dim=4, mlp_dim=8, num_layers=1)).init(
            jax.random.PRNGKey(0), jnp.ones((3,), jnp.int32)
        )


@pytest.mark.slow
def test_learnable_temperature_is_a_log_parameter_with_gradients(tiny_config):
    from samtone_jax.objectives.losses import contrastive_loss

    model = DualEncoder(tiny_config, architecture="sde", projection_dim=16, learnable_temperature=0.05)
    params = nn.unbox(init_params(model, jax.random.PRNGKey(0)))
    np.testing.assert_allclose(float(params["log_temperature"]), np.log(0.05), rtol=1e-6)
    q_tokens, d_tokens = _tokens(1), _tokens(2)

    def loss(p):
        q, d, _ = model.apply({"params": p}, q_tokens, d_tokens)
        tau = model.apply({"params": p}, method=model.temperature)
        return contrastive_loss(q, d, temperature=tau)[0]

    g = jax.jit(jax.grad(loss))(params)
    assert float(jnp.abs(g["log_temperature"])) > 0
    fixed = DualEncoder(tiny_config, projection_dim=16)
    assert "log_temperature" not in nn.unbox(init_params(fixed, jax.random.PRNGKey(0)))
    with pytest.raises(ValueError, match="learnable_temperature must be > 0"):
        init_params(DualEncoder(tiny_config, learnable_temperature=0.0), jax.random.PRNGKey(0))


@pytest.mark.parametrize(
    "scan,remat",
    [
        pytest.param(True, False, marks=pytest.mark.slow),
        (True, True),
        (False, True),
    ],
)
def test_scanned_and_rematerialised_layers_equal_the_plain_ones(tiny_config, scan, remat):
    """T5Config.scan_layers and / or remat: the same parameter tree, hidden states and gradients."""
    config = dataclasses.replace(tiny_config, num_layers=3)
    tokens = _tokens(4)
    unrolled, scanned = T5Encoder(config), T5Encoder(dataclasses.replace(config, scan_layers=scan, remat=remat))
    params = nn.unbox(jax.jit(unrolled.init)(jax.random.PRNGKey(0), tokens)["params"])
    scanned_init = nn.unbox(jax.jit(scanned.init)(jax.random.PRNGKey(0), tokens)["params"])
    assert jax.tree_util.tree_structure(scanned_init) == jax.tree_util.tree_structure(params)
    a, b = (_apply(m, params, tokens) for m in (unrolled, scanned))
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)

    def grads(model):
        weights = jnp.arange(config.emb_dim, dtype=jnp.float32)
        return jax.jit(jax.grad(lambda p: jnp.sum(model.apply({"params": p}, tokens) * weights)))(params)

    for x, y in zip(jax.tree_util.tree_leaves(grads(unrolled)), jax.tree_util.tree_leaves(grads(scanned)), strict=True):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-4 * float(jnp.abs(x).max()))
