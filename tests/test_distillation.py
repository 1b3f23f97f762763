"""The distillation losses against a float64 NumPy reference written here from the formulas, sharded
against single-device, at τ 0.01 in bfloat16, and their combination with the contrastive loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import numeric_grad
from jax.sharding import PartitionSpec as P

from samtone_jax.core.errors import BadValueError
from samtone_jax.objectives.distillation import distillation_loss, with_distillation
from samtone_jax.objectives.losses import contrastive_loss


def _unit(rng, *shape):
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _batch(seed=0, B=6, D=8, K=3):
    rng = np.random.RandomState(seed)
    teacher = rng.uniform(0, 20, (B, 1 + K))  # BM25-like scale
    return _unit(rng, B, D), _unit(rng, B, D), _unit(rng, B, K, D), teacher


def reference(q, d, n, t, *, mode, tau, tau_t):
    """One row and one candidate at a time, float64."""
    total = []
    for i in range(len(q)):
        s = [q[i] @ d[i] / tau] + [q[i] @ x / tau for x in n[i]]
        u = [v / tau_t for v in t[i]]
        if mode == "margin_mse":
            total += [((s[0] - s[k]) - (u[0] - u[k])) ** 2 for k in range(1, len(s))]
        else:
            p_t = np.exp(u) / np.sum(np.exp(u))
            log_p_s = np.array(s) - np.log(np.sum(np.exp(s)))
            total.append(float(np.sum(p_t * (np.log(p_t) - log_p_s))))
    return float(np.mean(total))


@pytest.mark.parametrize("mode,tau,tau_t", [("margin_mse", 0.05, 1.0), ("margin_mse", 1.0, 4.0), ("kl", 0.05, 2.0)])
def test_matches_float64_reference(mode, tau, tau_t):
    q, d, n, t = _batch()

    def ours(q_, d_, n_):
        kw = dict(mode=mode, temperature=tau, teacher_temperature=tau_t)
        return distillation_loss(q_, d_, n_, jnp.asarray(t, jnp.float32), **kw)[0]

    value, grads = jax.value_and_grad(ours, argnums=(0, 1, 2))(*(jnp.asarray(x, jnp.float32) for x in (q, d, n)))
    np.testing.assert_allclose(float(value), reference(q, d, n, t, mode=mode, tau=tau, tau_t=tau_t), rtol=1e-5)
    args = [q, d, n]
    for arg, g in enumerate(grads):

        def f(x, arg=arg):
            return reference(*[x if i == arg else a for i, a in enumerate(args)], t, mode=mode, tau=tau, tau_t=tau_t)

        want = numeric_grad(f, args[arg])
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_kl_is_zero_when_the_student_agrees_and_margins_ignore_a_shift():
    q, d, n, _ = _batch(seed=1)
    q, d, n = (jnp.asarray(x, jnp.float32) for x in (q, d, n))
    s = np.concatenate([np.sum(q * d, -1)[:, None], np.einsum("bd,bkd->bk", q, n)], axis=1)
    kl, metrics = distillation_loss(
        q, d, n, jnp.asarray(s / 0.05 * 3.0), mode="kl", temperature=0.05, teacher_temperature=3.0
    )
    assert abs(float(kl)) < 1e-5 and float(metrics["distill/teacher_agreement"]) == 1.0
    mse, _ = distillation_loss(q, d, n, jnp.asarray(s / 0.05 + 7.0), temperature=0.05)  # a shift of the teacher
    assert abs(float(mse)) < 1e-6


def test_sharded_equals_single_device():
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax is imported")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    q, d, n, t = (jnp.asarray(x, jnp.float32) for x in _batch(seed=2, B=32, D=16, K=2))
    for mode in ("margin_mse", "kl"):
        kw = dict(mode=mode, temperature=0.05)

        def sharded(q, d, kw=kw):
            local = lambda q, d, n, t: distillation_loss(q, d, n, t, axis_name="data", **kw)  # noqa: E731
            spec = P("data")
            return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=(P(), P()), check_vma=False)(
                q, d, n, t
            )

        (v1, m1), g1 = jax.jit(
            jax.value_and_grad(lambda q, d, kw=kw: distillation_loss(q, d, n, t, **kw), (0, 1), has_aux=True)
        )(q, d)
        (v8, m8), g8 = jax.jit(jax.value_and_grad(sharded, (0, 1), has_aux=True))(q, d)
        np.testing.assert_allclose(float(v8), float(v1), rtol=1e-5)
        for a, b in zip(g8, g1, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6 * np.abs(b).max())
        for name in m1:
            np.testing.assert_allclose(float(m8[name]), float(m1[name]), rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("mode", [pytest.param("margin_mse", marks=pytest.mark.slow), "kl"])
def test_bfloat16_at_temperature_001_has_finite_gradients(mode):
    q, d, n, t = _batch(seed=3, B=16, D=32, K=4)
    args = [jnp.asarray(x, jnp.bfloat16) for x in (q, d, n)]

    def f(q, d, n):
        return distillation_loss(q, d, n, jnp.asarray(t * 50), mode=mode, temperature=0.01)[0]

    value, grads = jax.value_and_grad(f, argnums=(0, 1, 2))(*args)
    assert np.isfinite(float(value)) and all(np.isfinite(np.asarray(g, np.float32)).all() for g in grads)
    assert value.dtype == jnp.float32


def test_combined_with_the_contrastive_loss_by_weights():
    q, d, n, t = (jnp.asarray(x, jnp.float32) for x in _batch(seed=4))
    distill = lambda q, d, n, t, axis_name=None: distillation_loss(q, d, n, t, temperature=0.05, axis_name=axis_name)  # noqa: E731
    contrastive = lambda q, d, **kw: contrastive_loss(q, d, temperature=0.05, **kw)  # noqa: E731
    total, metrics = with_distillation(contrastive, distill, 0.5, 2.0)(q, d, negatives=n, teacher_scores=t)
    c, _ = contrastive(q, d, negatives=n)
    m, _ = distill(q, d, n, t)
    np.testing.assert_allclose(float(total), 0.5 * float(c) + 2.0 * float(m), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["contrastive_loss"]), float(c), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["loss"]), float(total), rtol=1e-6)
    pure, pure_metrics = with_distillation(contrastive, distill, 0.0, 1.0)(q, d, negatives=n, teacher_scores=t)
    np.testing.assert_allclose(float(pure), float(m), rtol=1e-6)
    assert "contrastive_loss" not in pure_metrics
    with pytest.raises(BadValueError, match="not both 0"):
        with_distillation(contrastive, distill, 0.0, 0.0)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(mode="mse"), "mode='mse' must be one of"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(negatives=None), r"needs the teacher's candidates as negatives \[B, K, D\]"),
        (dict(teacher_scores=np.zeros((6, 3))), r"teacher_scores must be \[B, 1 \+ K\] = \[6, 4\]"),
    ],
)
def test_bad_input_names_the_argument(change, match):
    q, d, n, t = _batch()
    kwargs = dict(negatives=n, teacher_scores=t, mode="margin_mse", temperature=0.05) | change
    negatives, teacher = kwargs.pop("negatives"), kwargs.pop("teacher_scores")
    with pytest.raises(BadValueError, match=match):
        distillation_loss(
            jnp.asarray(q), jnp.asarray(d), negatives, None if teacher is None else jnp.asarray(teacher), **kwargs
        )
