"""The spread-out term (global orthogonal regularisation): its value against a float64 hand
computation, sharded over 8 devices equal to one device (value and gradient), gradient steps on it
spreading a clustered batch, and how it joins the training loss (objective.spread_out_weight)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from samtone_jax.core.errors import BadValueError
from samtone_jax.objectives.losses import contrastive_loss
from samtone_jax.objectives.spread_out import global_orthogonal, regularized

TAU = 0.05


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _reference(x: np.ndarray) -> tuple[float, float, float]:
    """GOR in float64 by loops over the pairs i != j."""
    x = np.asarray(x, np.float64)
    dots = [x[i] @ x[j] for i in range(len(x)) for j in range(len(x)) if i != j]
    m1, m2 = np.mean(dots), np.mean(np.square(dots))
    return m1**2 + max(0.0, m2 - 1.0 / x.shape[1]), m1, m2


def test_matches_a_float64_hand_computation():
    rng = np.random.RandomState(0)
    clustered = _unit(rng.normal(size=(10, 8)) * 0.3 + 1.0)  # all near one direction: M1 and M2 large
    spread = _unit(rng.normal(size=(10, 8)))
    for x in (clustered, spread):
        got = [float(v) for v in global_orthogonal(jnp.asarray(x, jnp.float32))]
        np.testing.assert_allclose(got, _reference(x), rtol=1e-5, atol=1e-7)
    assert _reference(clustered)[0] > 0.5 > _reference(spread)[0]
    # Orthonormal rows are the ideal: M1 = M2 = 0, nothing to pay.
    assert float(global_orthogonal(jnp.eye(8)[:6])[0]) == 0.0


def test_sharded_over_8_devices_equals_one_device():
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax is imported")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.RandomState(3)
    q = jnp.asarray(_unit(rng.normal(size=(32, 16)) + 0.5), jnp.float32)
    d = jnp.asarray(_unit(rng.normal(size=(32, 16)) + 0.5), jnp.float32)
    loss = regularized(functools.partial(contrastive_loss, temperature=TAU), 0.7)

    def local(q, d):
        return loss(q, d, axis_name="data")

    sharded = jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P("data")), out_specs=(P(), P()), check_vma=False)
    (v1, m1), g1 = jax.jit(jax.value_and_grad(lambda q, d: loss(q, d), argnums=(0, 1), has_aux=True))(q, d)
    (v8, m8), g8 = jax.jit(jax.value_and_grad(sharded, argnums=(0, 1), has_aux=True))(q, d)
    np.testing.assert_allclose(float(v8), float(v1), rtol=1e-5)
    for a, b in zip(g8, g1, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for name in m1:
        np.testing.assert_allclose(float(m8[name]), float(m1[name]), rtol=1e-5, atol=1e-7, err_msg=name)
    plain, _ = contrastive_loss(q, d, temperature=TAU)
    term = (_reference(np.asarray(q))[0] + _reference(np.asarray(d))[0]) / 2
    np.testing.assert_allclose(float(v1), float(plain) + 0.7 * term, rtol=1e-5)
    np.testing.assert_allclose(float(m1["spread_out/loss"]), term, rtol=1e-5)
    np.testing.assert_allclose(float(m1["spread_out/mean_query"]), _reference(np.asarray(q))[1], rtol=1e-5)


def test_gradient_steps_on_the_term_spread_a_clustered_batch():
    rng = np.random.RandomState(1)
    x = jnp.asarray(_unit(rng.normal(size=(16, 8)) * 0.2 + 1.0), jnp.float32)
    before = [float(v) for v in global_orthogonal(x)]
    step = jax.jit(jax.grad(lambda x: global_orthogonal(x / jnp.linalg.norm(x, axis=-1, keepdims=True))[0]))
    for _ in range(200):
        x = x - 0.5 * step(x)
        x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    after = [float(v) for v in global_orthogonal(x)]
    assert before[0] > 0.5 and after[0] < 0.01 * before[0]
    assert abs(after[1]) < 0.05 and after[2] < before[2] / 4  # mean near 0, second moment near 1/D


def test_the_training_objective_adds_it_and_refuses_a_bad_weight():
    from samtone_jax.data.input_spec import InputSpec
    from samtone_jax.training.objective import training_loss
    from samtone_jax.training.settings import ObjectiveSettings

    rng = np.random.RandomState(2)
    q, d = (jnp.asarray(_unit(rng.normal(size=(6, 8))), jnp.float32) for _ in range(2))
    base = functools.partial(contrastive_loss, temperature=TAU)
    spec = InputSpec("v", 8, 8)
    plain = training_loss(base, None, spec, ObjectiveSettings())
    assert plain is base  # off by default: the loss untouched
    value, metrics = training_loss(base, None, spec, ObjectiveSettings(spread_out_weight=0.5))(q, d)
    expected = float(base(q, d)[0]) + 0.5 * (_reference(np.asarray(q))[0] + _reference(np.asarray(d))[0]) / 2
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)
    assert float(metrics["loss"]) == float(value)
    # Beside a pure distillation objective (the contrastive term's weight 0) the term is still there, whole.
    distill = lambda q, d, n, t, axis_name=None: (jnp.float32(0.25), {})  # noqa: E731
    distilling = ObjectiveSettings(contrastive_weight=0.0, distillation_weight=1.0, spread_out_weight=0.5)
    teacher = InputSpec("v", 8, 8, num_negatives=1, teacher_scores=True)
    value, _ = training_loss(base, distill, teacher, distilling)(q, d, negatives=q[:, None], teacher_scores=None)
    term = (_reference(np.asarray(q))[0] + _reference(np.asarray(d))[0]) / 2
    np.testing.assert_allclose(float(value), 0.25 + 0.5 * term, rtol=1e-5)
    for weight in (-0.1, float("nan"), float("inf"), "1"):
        with pytest.raises(BadValueError, match="objective.spread_out_weight must be a number >= 0"):
            training_loss(base, None, spec, ObjectiveSettings(spread_out_weight=weight))
