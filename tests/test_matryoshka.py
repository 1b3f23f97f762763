"""Matryoshka: the nested loss against the float64 reference on truncated embeddings, at one dimension
equal to the plain loss, sharded equal to one device, and its bad settings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_losses import reference_loss

from samtone_jax.core.errors import BadValueError
from samtone_jax.objectives.losses import contrastive_loss
from samtone_jax.objectives.matryoshka import nested, truncate

TAU = 0.05


def _unit(rng, *shape):
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _batch(seed=0, B=6, D=16, K=2):
    rng = np.random.RandomState(seed)
    q, d, n = _unit(rng, B, D), _unit(rng, B, D), _unit(rng, B, K, D)
    qid, did = np.array([1, 2, 3, 4, 2, 6]), np.array([7, 8, 9, 7, 10, 11])  # duplicates, as test_losses
    return q, d, n, qid, did, np.arange(100, 100 + B * K).reshape(B, K)


def _head(x, k):
    """The reference's truncation, in float64: the first k coordinates over their norm."""
    return x[..., :k] / np.linalg.norm(x[..., :k], axis=-1, keepdims=True)


@pytest.mark.parametrize(
    "setting",
    [
        dict(mode="samtone", same_tower="query", bidirectional=True),
        dict(mode="gte", same_tower="none", bidirectional=True),
    ],
    ids=["samtone", "gte"],
)
def test_nested_loss_is_the_weighted_sum_of_the_reference_at_each_truncation(setting):
    q, d, n, qid, did, nid = _batch()
    dims, weights = (4, 8, 16), (0.5, 1.0, 2.0)
    want = sum(
        w * reference_loss(_head(q, k), _head(d, k), _head(n, k), qid, did, nid, tau=TAU, **setting)
        for k, w in zip(dims, weights, strict=True)
    )
    ids = dict(query_ids=jnp.asarray(qid), doc_ids=jnp.asarray(did), negative_ids=jnp.asarray(nid))
    loss = nested(lambda q, d, **kw: contrastive_loss(q, d, temperature=TAU, **setting, **kw), dims, weights)
    value, metrics = loss(jnp.asarray(q, jnp.float32), jnp.asarray(d, jnp.float32), negatives=jnp.asarray(n), **ids)
    np.testing.assert_allclose(float(value), want, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss"]), want, rtol=1e-5)
    for k in dims:
        ref = reference_loss(_head(q, k), _head(d, k), _head(n, k), qid, did, nid, tau=TAU, **setting)
        np.testing.assert_allclose(float(metrics[f"matryoshka/loss_{k}"]), ref, rtol=1e-5)


def test_at_the_full_dimension_alone_it_is_the_plain_loss():
    q, d, n, *_ = (jnp.asarray(x, jnp.float32) for x in _batch(seed=1))
    plain, plain_metrics = contrastive_loss(q, d, temperature=TAU, negatives=n)
    value, metrics = nested(lambda q, d, **kw: contrastive_loss(q, d, temperature=TAU, **kw), [16])(q, d, negatives=n)
    np.testing.assert_allclose(float(value), float(plain), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["accuracy"]), float(plain_metrics["accuracy"]))
    np.testing.assert_allclose(np.asarray(truncate(q, 16)), np.asarray(q), rtol=1e-6)


def test_sharded_equals_single_device():
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax is imported")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.RandomState(2)
    q, d = (jnp.asarray(_unit(rng, 32, 16), jnp.float32) for _ in range(2))
    did = jnp.asarray(rng.randint(0, 12, 32))
    loss = nested(lambda q, d, **kw: contrastive_loss(q, d, temperature=TAU, same_tower="both", **kw), (4, 16))

    def sharded(q, d):
        local = lambda q, d, did: loss(q, d, doc_ids=did, axis_name="data")  # noqa: E731
        return jax.shard_map(local, mesh=mesh, in_specs=(P("data"),) * 3, out_specs=(P(), P()), check_vma=False)(
            q, d, did
        )

    (v1, m1), g1 = jax.jit(jax.value_and_grad(lambda q, d: loss(q, d, doc_ids=did), (0, 1), has_aux=True))(q, d)
    (v8, m8), g8 = jax.jit(jax.value_and_grad(sharded, (0, 1), has_aux=True))(q, d)
    np.testing.assert_allclose(float(v8), float(v1), rtol=1e-5)
    np.testing.assert_allclose(float(m8["matryoshka/loss_4"]), float(m1["matryoshka/loss_4"]), rtol=1e-5)
    for a, b in zip(g8, g1, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6 * np.abs(b).max())


@pytest.mark.parametrize(
    "dims,weights,match",
    [
        ((8, 4), None, "strictly increasing positive"),
        ((0, 4), None, "strictly increasing positive"),
        ((4, 8), (1.0,), "one weight >= 0 per dimension"),
        ((4, 8), (0.0, 0.0), "not all 0"),
    ],
)
def test_bad_dimensions_and_weights_are_refused(dims, weights, match):
    with pytest.raises(BadValueError, match=match):
        nested(contrastive_loss, dims, weights)


def test_dimensions_beyond_the_embedding_are_refused():
    q, d, *_ = (jnp.asarray(x, jnp.float32) for x in _batch())
    with pytest.raises(BadValueError, match=r"go beyond the embedding dimension 16 \(PROJECTION_DIM"):
        nested(lambda q, d, **kw: contrastive_loss(q, d, temperature=TAU, **kw), (8, 32))(q, d)


@pytest.mark.slow
def test_training_with_nested_dimensions_logs_each_term(wordnet_env, tmp_path):
    import tensorflow as tf
    from conftest import tiny_train_argv
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from samtone_jax.cli import main as cli

    extra = ["--gin.objective.matryoshka_dims=(8, 32)", "--gin.objective.matryoshka_weights=(1.0, 0.5)"]
    assert cli.main(tiny_train_argv(tmp_path / "run", wordnet_env[1], extra=extra)) == 0
    events = EventAccumulator(str(tmp_path / "run" / "train"))
    events.Reload()
    logged = {
        name: [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors(name)]
        for name in ("loss", "matryoshka/loss_8", "matryoshka/loss_32")
    }
    # the gin weights reach the loss: 1 · L_8 + 0.5 · L_32
    np.testing.assert_allclose(
        logged["loss"], np.add(logged["matryoshka/loss_8"], np.multiply(0.5, logged["matryoshka/loss_32"])), rtol=1e-5
    )
