"""Quantization-aware training: the loss against the float64 reference on embeddings quantized here
(sentence-transformers' int8 codes with the batch's ranges, sign bits), straight-through gradients,
composed with Matryoshka, sharded equal to one device, GradCache equal to plain, its bad settings, and
a run that logs each term."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_losses import reference_loss

from samtone_jax.core.errors import BadValueError
from samtone_jax.objectives.losses import contrastive_loss
from samtone_jax.objectives.matryoshka import nested
from samtone_jax.objectives.quantization_aware import aware, check_start

TAU = 0.05
SETTING = dict(mode="samtone", same_tower="query", bidirectional=True)


def _unit(rng, *shape):
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _batch(seed=0, B=6, D=16, K=2):
    rng = np.random.RandomState(seed)
    q, d = _unit(rng, B, D).astype(np.float32), _unit(rng, B, D).astype(np.float32)
    n = _unit(rng, B, K, D).astype(np.float32)
    qid, did = np.array([1, 2, 3, 4, 2, 6]), np.array([7, 8, 9, 7, 10, 11])
    return q, d, n, qid, did, np.arange(100, 100 + B * K).reshape(B, K)


def _int8_here(q, d, n):
    """(codes of q, d, n as float64, K = their mean row norm, step [D]) with sentence-transformers'
    quantizer and the batch's document ranges."""
    from sentence_transformers.util.quantization import quantize_embeddings

    documents = np.concatenate([d, n.reshape(-1, d.shape[1])])
    ranges = np.stack([documents.min(axis=0), documents.max(axis=0)])
    codes = [
        quantize_embeddings(x.reshape(-1, x.shape[-1]), "int8", ranges=ranges).astype(np.float64).reshape(x.shape)
        for x in (q, d, n)
    ]
    scale = np.mean(np.linalg.norm(np.concatenate([c.reshape(-1, c.shape[-1]) for c in codes]), axis=1))
    return codes, scale, (ranges[1] - ranges[0]) / np.float32(255)


def _served_here(q, d, n, precision):
    """The served vectors, computed here (float64 after): ±1/√D of the sign bits, or codes / K."""
    if precision == "binary":
        return [np.where(x > 0, 1.0, -1.0) / np.sqrt(x.shape[-1]) for x in (q, d, n)]
    codes, scale, _ = _int8_here(q, d, n)
    return [c / scale for c in codes]


def _int8_chain(q, d, n):
    """d(served)/dx per dimension for int8: the continuous code's slope 1 / step, over K, with the
    step floored at a tenth of the mean step (a dimension constant over the documents)."""
    _, scale, step = _int8_here(q, d, n)
    return 1.0 / (np.maximum(step, 0.1 * step.mean()) * scale)


def _dead_dimension(seed=5):
    """A batch whose dimension 0 is all but constant over the documents (range 1e-33, as one of
    all-MiniLM-L6-v2's is): its int8 step is ~4e-36."""
    q, d, n, *_ = _batch(seed=seed)
    rng = np.random.RandomState(seed)
    for x in (q, d, n):
        x[..., 0] = 1e-33 * rng.uniform(size=x.shape[:-1])
    return q, d, n


def _loss(precisions, weights=None):
    return aware(lambda q, d, **kw: contrastive_loss(q, d, temperature=TAU, **SETTING, **kw), precisions, weights)


def test_the_loss_is_the_weighted_reference_at_each_served_precision():
    q, d, n, qid, did, nid = _batch()
    precisions, weights = ("float32", "int8", "binary"), (1.0, 0.5, 2.0)
    want = {"float32": reference_loss(q, d, n, qid, did, nid, tau=TAU, **SETTING)}
    for p in ("int8", "binary"):
        want[p] = reference_loss(*_served_here(q, d, n, p), qid, did, nid, tau=TAU, **SETTING)
    ids = dict(query_ids=jnp.asarray(qid), doc_ids=jnp.asarray(did), negative_ids=jnp.asarray(nid))
    value, metrics = _loss(precisions, weights)(jnp.asarray(q), jnp.asarray(d), negatives=jnp.asarray(n), **ids)
    for p in precisions:
        np.testing.assert_allclose(float(metrics[f"quantized/loss_{p}"]), want[p], rtol=2e-5)
    terms = [w * float(metrics[f"quantized/loss_{p}"]) for p, w in zip(precisions, weights, strict=True)]
    np.testing.assert_allclose(float(value), sum(terms), rtol=1e-6)
    plain, plain_metrics = contrastive_loss(
        jnp.asarray(q), jnp.asarray(d), temperature=TAU, negatives=jnp.asarray(n), **SETTING, **ids
    )
    assert float(metrics["accuracy"]) == float(plain_metrics["accuracy"])  # the first precision's metrics
    step = _int8_here(q, d, n)[2]  # the collapse monitor: the documents' mean per-dimension range
    np.testing.assert_allclose(float(metrics["quantized/int8_range"]), np.mean(step * 255), rtol=1e-5)


def test_gradients_pass_straight_through_the_quantizer():
    """d/dx of L(Q(x)) is (dL/dy)(Q(x)): the gradient of the loss evaluated at the served vectors; int8
    through the continuous code, also with a dimension constant over the documents (a finite norm)."""
    for q, d, n, precision in [(*_batch(seed=3)[:3], p) for p in ("binary", "int8")] + [(*_dead_dimension(), "int8")]:
        q, d, n = (jnp.asarray(x) for x in (q, d, n))
        loss = _loss([precision])
        grads = jax.grad(lambda q, d, n, loss=loss: loss(q, d, negatives=n)[0], (0, 1, 2))(q, d, n)
        served = [jnp.asarray(x, jnp.float32) for x in _served_here(*map(np.asarray, (q, d, n)), precision)]
        want = jax.grad(lambda q, d, n: contrastive_loss(q, d, temperature=TAU, negatives=n, **SETTING)[0], (0, 1, 2))(
            *served
        )
        if precision == "int8":  # the chain rule through the continuous code
            want = [np.asarray(w) * _int8_chain(*map(np.asarray, (q, d, n))) for w in want]
        for a, b in zip(grads, want, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-5)
            assert np.abs(np.asarray(a)).max() > 0  # not a stopped gradient
            assert np.isfinite(np.sum(np.square(np.asarray(a, np.float32))))  # optax.global_norm's sum


def test_composed_with_matryoshka_every_dimension_and_precision_is_a_term():
    q, d, n, qid, did, nid = _batch(seed=1)
    loss = nested(_loss(("float32", "binary")), (4, 16), (1.0, 0.5))
    ids = dict(query_ids=jnp.asarray(qid), doc_ids=jnp.asarray(did), negative_ids=jnp.asarray(nid))
    value, metrics = loss(jnp.asarray(q), jnp.asarray(d), negatives=jnp.asarray(n), **ids)

    def head(x, k):
        return x[..., :k] / np.linalg.norm(x[..., :k], axis=-1, keepdims=True)

    want = 0.0
    for k, w in ((4, 1.0), (16, 0.5)):
        parts = [head(x, k) for x in (q, d, n)]
        want += w * reference_loss(*parts, qid, did, nid, tau=TAU, **SETTING)
        want += w * reference_loss(*_served_here(*parts, "binary"), qid, did, nid, tau=TAU, **SETTING)
    np.testing.assert_allclose(float(value), want, rtol=2e-5)


def test_sharded_equals_single_device_and_grad_cache_equals_plain():
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax is imported")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.RandomState(2)
    q, d = (jnp.asarray(_unit(rng, 32, 16), jnp.float32) for _ in range(2))
    n = jnp.asarray(_unit(rng, 32, 2, 16), jnp.float32)
    did = jnp.asarray(rng.randint(0, 12, 32))
    loss = _loss(("float32", "int8", "binary"))

    def sharded(q, d, n):
        local = lambda q, d, n, did: loss(q, d, negatives=n, doc_ids=did, axis_name="data")  # noqa: E731
        return jax.shard_map(local, mesh=mesh, in_specs=(P("data"),) * 4, out_specs=(P(), P()), check_vma=False)(
            q, d, n, did
        )

    single = jax.value_and_grad(lambda q, d, n: loss(q, d, negatives=n, doc_ids=did), (0, 1, 2), has_aux=True)
    (v1, m1), g1 = jax.jit(single)(q, d, n)
    (v8, m8), g8 = jax.jit(jax.value_and_grad(sharded, (0, 1, 2), has_aux=True))(q, d, n)
    np.testing.assert_allclose(float(v8), float(v1), rtol=1e-5)  # the int8 ranges are the global batch's
    np.testing.assert_allclose(float(m8["quantized/loss_int8"]), float(m1["quantized/loss_int8"]), rtol=1e-5)
    for a, b in zip(g8, g1, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6 * np.abs(b).max())


@pytest.mark.parametrize(
    "precisions, weights, match",
    [
        (("float32", "int4"), None, "unknown objective.quantized_precisions entry 'int4'"),
        (("binary", "binary"), None, "distinct precisions"),
        (("float32", "binary"), (1.0,), "one weight >= 0 per precision"),
        (("float32", "binary"), (0.0, 0.0), "not all 0"),
    ],
)
def test_bad_settings_are_refused(precisions, weights, match):
    with pytest.raises(BadValueError, match=match):
        _loss(precisions, weights)


def test_int8_awareness_needs_a_trained_start():
    """int8-aware training from a random initialisation collapses (quantization_aware's docstring):
    refused without train.init_checkpoint; binary-aware training, a fine-tune and a continued run are not."""
    with pytest.raises(BadValueError, match="train.init_checkpoint=<that run>"):
        check_start(("float32", "int8"), None)
    check_start(("float32", "int8"), "runs/float_model")
    check_start(("float32", "int8"), None, saved_steps=[300])  # a trained run continued with the term
    check_start(("float32", "binary"), None)
    check_start(None, None)


@pytest.mark.slow
def test_a_quantization_aware_run_with_grad_cache_logs_each_term(wordnet_env, tmp_path, capsys):
    """Through gin and the CLI, with GradCache: the logged loss is the weighted sum of the logged
    terms (the weights reach the loss), and the run equals the same run without GradCache."""
    import tensorflow as tf
    from conftest import tiny_train_argv
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from samtone_jax.cli import main as cli

    extra = [
        "--gin.objective.quantized_precisions=('float32', 'binary')",
        "--gin.objective.quantized_weights=(1.0, 0.5)",
    ]
    logged = {}
    for name, more in (("plain", []), ("grad_cache", ["--gin.step.grad_cache_chunk_size=4"])):
        assert cli.main(tiny_train_argv(tmp_path / name, wordnet_env[1], steps=2, extra=[*extra, *more])) == 0
        events = EventAccumulator(str(tmp_path / name / "train"))
        events.Reload()
        logged[name] = {
            tag: [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)]
            for tag in ("loss", "quantized/loss_float32", "quantized/loss_binary")
        }
    terms = logged["plain"]
    np.testing.assert_allclose(
        terms["loss"],
        np.add(terms["quantized/loss_float32"], np.multiply(0.5, terms["quantized/loss_binary"])),
        rtol=1e-5,
    )
    for tag, values in terms.items():
        np.testing.assert_allclose(logged["grad_cache"][tag], values, rtol=1e-4)
    assert (
        cli.main(tiny_train_argv(tmp_path / "bad", wordnet_env[1], extra=["--gin.objective.quantized_weights=(1.0,)"]))
        == 2
    )
    int8 = ["--gin.objective.quantized_precisions=('float32', 'int8')"]  # from scratch: refused before MODEL_DIR
    capsys.readouterr()
    assert cli.main(tiny_train_argv(tmp_path / "int8", wordnet_env[1], extra=int8)) == 2
    assert "train.init_checkpoint=<that run>" in capsys.readouterr().err and not (tmp_path / "int8").exists()
