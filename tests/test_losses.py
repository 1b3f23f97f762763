"""The contrastive losses against a float64 NumPy reference written here from the formulas,
against sentence-transformers' MNRL, sharded against single-device, and at extreme temperatures."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import numeric_grad

from samtone_jax.objectives.losses import contrastive_loss

TAU = 0.05


# ----------------------------------------------------------------------------------------------
# The reference: one row at a time, float64, straight from the formulas in docs/DESIGN.md.
# ----------------------------------------------------------------------------------------------
def reference_loss(q, d, n, qid, did, nid, *, tau, mode, same_tower, bidirectional, w=1.0, alpha=0.1, guide=None):
    """guide: per row, the document ids a teacher flags as its false negatives (or None)."""
    B = len(q)
    guide = [set() for _ in range(B)] if guide is None else [set(g) for g in guide]
    n = np.zeros((B, 0, q.shape[1])) if n is None else n
    flat_n, flat_nid = n.reshape(-1, q.shape[1]), (None if nid is None else nid.reshape(-1))
    s = lambda a, b: float(a @ b) / tau  # noqa: E731

    def same_example(i, j):  # share a query id or a document id, or either's guide holds the other's document
        return qid[i] == qid[j] or did[i] == did[j] or did[j] in guide[i] or did[i] in guide[j]

    def log_sum(terms):
        return np.log(np.sum(np.exp(terms)))

    def cross(i, a, cols):  # in-batch cross-tower terms of row i, positive kept
        return [s(a, cols[j]) for j in range(B) if j == i or not same_example(i, j)]

    def same(i, a, cols):  # same-tower terms of row i, scaled by w
        return [s(a, cols[j]) + np.log(w) for j in range(B) if j != i and not same_example(i, j)]

    def hard(i):  # a negative that is its own pair's document (padding) is no negative of any row
        return [
            s(q[i], x)
            for m, x in enumerate(flat_n)
            if flat_nid is None
            or (flat_nid[m] != did[i] and flat_nid[m] != did[m // n.shape[1]] and flat_nid[m] not in guide[i])
        ]

    pos = np.array([s(q[i], d[i]) for i in range(B)])
    if mode == "pairwise":  # STAR: mean logistic loss over random pairs + over hard pairs
        softplus = lambda x: np.log1p(np.exp(x))  # noqa: E731
        random = [
            softplus(s(q[i], d[j]) - pos[i]) for i in range(B) for j in range(B) if j != i and not same_example(i, j)
        ]
        hard_pairs = [softplus(x - pos[i]) for i in range(B) for x in hard(i)]
        return np.mean(random) + (np.mean(hard_pairs) if hard_pairs else 0.0)
    if mode == "gte":
        terms = [
            cross(i, q[i], d) + hard(i) + cross(i, d[i], q) + same(i, q[i], q) + same(i, d[i], d) for i in range(B)
        ]
        return np.mean([log_sum(t) - pos[i] for i, t in enumerate(terms)])
    l_qd = [
        log_sum(cross(i, q[i], d) + hard(i) + (same(i, q[i], q) if same_tower in ("query", "both") else [])) - pos[i]
        for i in range(B)
    ]
    loss = np.mean(l_qd)
    if bidirectional:
        l_dq = [
            log_sum(cross(i, d[i], q) + (same(i, d[i], d) if same_tower in ("doc", "both") else [])) - pos[i]
            for i in range(B)
        ]
        loss = 0.5 * (loss + np.mean(l_dq))
    if mode == "pair":
        l_p = [
            log_sum([pos[i]] + [s(d[i], d[j]) for j in range(B) if j != i and not same_example(i, j)]) - pos[i]
            for i in range(B)
        ]
        loss = (1 - alpha) * loss + alpha * np.mean(l_p)
    return loss


def _unit(rng, *shape):
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _batch(seed=0, B=6, D=8, K=2, with_ids=False):
    rng = np.random.RandomState(seed)
    q, d, n = _unit(rng, B, D), _unit(rng, B, D), _unit(rng, B, K, D)
    if with_ids:
        # Duplicates: pairs 0 and 3 share a document, pairs 1 and 4 share a query; one hard
        # negative of pair 2 is pair 5's positive document; pair 0's first negative is its own positive
        # (and pair 3's, which shares it): no negative of any row.
        qid = np.array([10, 11, 12, 13, 11, 15])
        did = np.array([20, 21, 22, 20, 24, 25])
        nid = np.arange(100, 100 + B * K).reshape(B, K)
        nid[2, 1] = 25
        nid[0, 0] = 20
        return q, d, n, qid, did, nid
    return q, d, n, None, None, None


def _ours(q, d, n, qid, did, nid, **kw):
    def f(q, d):
        return contrastive_loss(
            q,
            d,
            temperature=TAU,
            negatives=None if n is None else jnp.asarray(n, jnp.float32),
            query_ids=None if qid is None else jnp.asarray(qid),
            doc_ids=None if did is None else jnp.asarray(did),
            negative_ids=None if nid is None else jnp.asarray(nid),
            **kw,
        )[0]

    value, grads = jax.value_and_grad(f, argnums=(0, 1))(jnp.asarray(q, jnp.float32), jnp.asarray(d, jnp.float32))
    return float(value), [np.asarray(g, np.float64) for g in grads]


SETTINGS = [
    dict(mode="samtone", same_tower=st, bidirectional=bi)
    for st, bi in itertools.product(["none", "query", "doc", "both"], [True, False])
    if bi or st in ("none", "query")
] + [
    dict(mode="pair", same_tower="none", bidirectional=False),
    dict(mode="pair", same_tower="query", bidirectional=True),
    dict(mode="gte", same_tower="none", bidirectional=True),
    dict(mode="pairwise", same_tower="none", bidirectional=False),
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
@pytest.mark.parametrize(
    "negatives,with_ids", [(False, False), (True, False), (True, True)], ids=["plain", "hardneg", "ids"]
)
def test_matches_float64_reference(setting, negatives, with_ids):
    q, d, n, qid, did, nid = _batch(with_ids=with_ids)
    n = n if negatives else None
    nid = nid if negatives else None
    B = len(q)
    rqid = np.arange(B) if qid is None else qid
    rdid = np.arange(B) if did is None else did
    ref = lambda q_, d_: reference_loss(q_, d_, n, rqid, rdid, nid, tau=TAU, **setting)  # noqa: E731
    value, (gq, gd) = _ours(q, d, n, qid, did, nid, **setting)
    np.testing.assert_allclose(value, ref(q, d), rtol=1e-5)
    scale = max(np.abs(gq).max(), np.abs(gd).max())
    np.testing.assert_allclose(gq, numeric_grad(lambda x: ref(x, d), q), rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(gd, numeric_grad(lambda x: ref(q, x), d), rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_negatives_padded_with_their_own_positive_are_no_negatives(setting):
    """inputs.negatives_fallback's padding: a query's missing hard negatives are copies of its positive
    with its id. Every slot padded: the loss and gradient of the batch without hard negatives (the mixed
    case, some rows padded: test_matches_float64_reference's pair 0)."""
    q, d, n, qid, did, nid = _batch(with_ids=True)
    k = n.shape[1]
    padded_n, padded_ids = np.repeat(d[:, None], k, axis=1), np.repeat(did[:, None], k, axis=1)
    value, grads = _ours(q, d, padded_n, qid, did, padded_ids, **setting)
    plain, plain_grads = _ours(q, d, None, qid, did, None, **setting)
    np.testing.assert_allclose(value, plain, rtol=1e-6)
    for a, b in zip(grads, plain_grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


GUIDED = [
    dict(mode="samtone", same_tower="both", bidirectional=True),
    dict(mode="samtone", same_tower="query", bidirectional=False),
    dict(mode="pair", same_tower="query", bidirectional=True),
    dict(mode="gte", same_tower="none", bidirectional=True),
    dict(mode="pairwise", same_tower="none", bidirectional=False),
]


def _guide_ids(did, nid):
    """[B, 3] guide ids: row 1 flags pair 2's document and its own hard negative nid[1, 0]; row 5
    flags pair 0's document (so pair 0 loses pair 5 too, by symmetry); unused slots hold the row's
    own document id; row 3 flags an id no one has."""
    guide = np.repeat(did[:, None], 3, axis=1)
    guide[1, :2] = [did[2], nid[1, 0]]
    guide[5, 0] = did[0]
    guide[3, 0] = 999
    return guide


@pytest.mark.parametrize("setting", GUIDED, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_guide_ids_remove_flagged_documents_from_every_term(setting):
    q, d, n, qid, did, nid = _batch(with_ids=True)
    guide = _guide_ids(did, nid)
    ref = lambda q_, d_: reference_loss(q_, d_, n, qid, did, nid, tau=TAU, guide=guide, **setting)  # noqa: E731
    value, (gq, gd) = _ours(q, d, n, qid, did, nid, guide_ids=jnp.asarray(guide), **setting)
    np.testing.assert_allclose(value, ref(q, d), rtol=1e-5)
    scale = max(np.abs(gq).max(), np.abs(gd).max())
    np.testing.assert_allclose(gq, numeric_grad(lambda x: ref(x, d), q), rtol=1e-5, atol=1e-5 * scale)
    np.testing.assert_allclose(gd, numeric_grad(lambda x: ref(q, x), d), rtol=1e-5, atol=1e-5 * scale)
    unguided, _ = _ours(q, d, n, qid, did, nid, **setting)
    assert abs(unguided - value) > 1e-3  # the guide really removes terms


def test_guided_fraction_counts_what_the_guide_alone_removes():
    q, d, n, qid, did, nid = _batch(with_ids=True)
    guide = jnp.asarray(_guide_ids(did, nid))
    args = dict(temperature=TAU, negatives=jnp.asarray(n), query_ids=jnp.asarray(qid), doc_ids=jnp.asarray(did))
    _, m = contrastive_loss(jnp.asarray(q), jnp.asarray(d), negative_ids=jnp.asarray(nid), guide_ids=guide, **args)
    _, plain = contrastive_loss(jnp.asarray(q), jnp.asarray(d), negative_ids=jnp.asarray(nid), **args)
    # Removed by the guide alone, of 6·5 in-batch + 6·12 hard candidates: (1, 2), (2, 1), (5, 0), (0, 5),
    # (5, 3) and (3, 5) (pair 3 shares pair 0's document); for row 1 the hard negative nid[1, 0]. (Row 5
    # also flags nid[0, 0], document 20, but that is pair 0's own positive: no row's negative already.)
    np.testing.assert_allclose(float(m["guided_fraction"]), 7 / (30 + 72), rtol=1e-6)
    np.testing.assert_allclose(float(m["masked_fraction"]) - float(plain["masked_fraction"]), 7 / 102, rtol=1e-5)
    assert "guided_fraction" not in plain


def test_same_tower_weight_and_pair_alpha_follow_the_formula():
    q, d, n, qid, did, nid = _batch(seed=3)
    B = len(q)
    for w, alpha in [(0.5, 0.3), (0.0, 1.0)]:
        setting = dict(mode="pair", same_tower="both", bidirectional=True)
        value, _ = _ours(q, d, None, None, None, None, same_tower_weight=w, pair_alpha=alpha, **setting)
        with np.errstate(divide="ignore"):
            ref = reference_loss(q, d, None, np.arange(B), np.arange(B), None, tau=TAU, w=w, alpha=alpha, **setting)
        np.testing.assert_allclose(value, ref, rtol=1e-5)


def test_masking_removes_duplicates_from_every_term():
    """With every pair a duplicate of pair 0's document, SamToNe on both towers with ids equals
    the loss of a batch where only the positives remain (−S + log e^{S} = 0 per direction)."""
    rng = np.random.RandomState(1)
    q = _unit(rng, 4, 8)
    d = np.repeat(_unit(rng, 1, 8), 4, axis=0)
    ids = jnp.zeros(4, jnp.int32)
    loss, metrics = contrastive_loss(jnp.asarray(q), jnp.asarray(d), temperature=0.01, same_tower="both", doc_ids=ids)
    np.testing.assert_allclose(float(loss), 0.0, atol=1e-4)  # float32 rounding of s/τ at τ = 0.01
    np.testing.assert_allclose(float(metrics["masked_fraction"]), 1.0)
    unmasked, _ = contrastive_loss(jnp.asarray(q), jnp.asarray(d), temperature=0.01, same_tower="both")
    assert float(unmasked) > 1.0  # without ids the duplicates are (wrongly) negatives


@pytest.mark.slow
def test_metrics_are_what_they_say():
    q, d, n, *_ = _batch(seed=2, B=5, K=1)
    q, d, n = (jnp.asarray(x, jnp.float32) for x in (q, d, n))
    _, m = contrastive_loss(q, d, temperature=TAU, negatives=n)
    s_qd, s_qn = np.asarray(q @ d.T), np.asarray(q @ n[:, 0].T)
    pos = np.diag(s_qd)
    others = np.where(np.eye(5, dtype=bool), -np.inf, s_qd)
    hardest = np.maximum(others.max(1), s_qn.max(1))
    np.testing.assert_allclose(float(m["positive_similarity"]), pos.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m["hardest_negative_similarity"]), hardest.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m["accuracy"]), np.mean(pos > hardest))
    assert float(m["masked_fraction"]) == 0.0 and float(m["temperature"]) == pytest.approx(TAU)
    assert {"logsumexp/query_to_doc", "logsumexp/doc_to_query", "loss"} <= set(m)


def test_learnable_temperature_gets_a_gradient():
    q, d, *_ = _batch(seed=4)

    def f(log_t):
        return contrastive_loss(jnp.asarray(q), jnp.asarray(d), temperature=jnp.exp(log_t))[0]

    g = jax.grad(f)(jnp.log(0.05))
    eps = 1e-3
    np.testing.assert_allclose(
        float(g), (float(f(jnp.log(0.05) + eps)) - float(f(jnp.log(0.05) - eps))) / (2 * eps), rtol=1e-2
    )


# ----------------------------------------------------------------------------------------------
# sentence-transformers 6.2 MultipleNegativesRankingLoss on the same embeddings, scale = 1/τ.
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "directions,partition,ours",
    [
        (("query_to_doc", "query_to_query"), "joint", dict(mode="samtone", same_tower="query", bidirectional=False)),
        (("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc"), "joint", dict(mode="gte")),
        (
            ("query_to_doc", "doc_to_query"),
            "per_direction",
            dict(mode="samtone", same_tower="none", bidirectional=True),
        ),
    ],
)
def test_matches_sentence_transformers_mnrl(directions, partition, ours):
    torch = pytest.importorskip("torch")
    losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    q, d, *_ = _batch(seed=5, B=7, D=16)
    mnrl = losses.MultipleNegativesRankingLoss(None, scale=1.0 / TAU, directions=directions, partition_mode=partition)
    tq = torch.tensor(q, dtype=torch.float64, requires_grad=True)
    td = torch.tensor(d, dtype=torch.float64, requires_grad=True)
    theirs = mnrl.compute_loss_from_embeddings([tq, td], None)
    theirs.backward()
    value, (gq, gd) = _ours(q, d, None, None, None, None, **ours)
    np.testing.assert_allclose(value, theirs.item(), rtol=1e-5)

    # cos_sim normalises its inputs, so compare gradients in the tangent space of the unit sphere.
    def tangent(g, x):
        return g - np.sum(g * x, axis=1, keepdims=True) * x

    np.testing.assert_allclose(tangent(gq, q), tangent(tq.grad.numpy(), q), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(tangent(gd, d), tangent(td.grad.numpy(), d), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Sharded over 8 devices == one device with the whole batch.
# ----------------------------------------------------------------------------------------------
def _mesh():
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax is imported")
    return jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def _sharded(mesh, **kw):
    from jax.sharding import PartitionSpec as P

    def local(q, d, n, qid, did, nid, guide):
        return contrastive_loss(
            q, d, negatives=n, query_ids=qid, doc_ids=did, negative_ids=nid, guide_ids=guide, axis_name="data", **kw
        )

    spec = P("data")
    return jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 7, out_specs=(P(), P()), check_vma=False)


@pytest.mark.parametrize(
    "setting", SETTINGS[:1] + SETTINGS[2:3] + SETTINGS[-4:], ids=lambda s: "-".join(str(v) for v in s.values())
)
def test_sharded_equals_single_device(setting):
    mesh = _mesh()
    rng = np.random.RandomState(7)
    B, D, K = 32, 16, 2
    q, d, n = (jnp.asarray(_unit(rng, *s), jnp.float32) for s in [(B, D), (B, D), (B, K, D)])
    qid = jnp.asarray(rng.randint(0, 20, B))  # many duplicate queries and documents across devices
    did = jnp.asarray(rng.randint(0, 20, B))
    nid = jnp.asarray(rng.randint(0, 40, (B, K)))
    guide = jnp.asarray(rng.randint(0, 60, (B, 2)))  # teacher-flagged ids, in-batch and hard alike
    kw = dict(temperature=TAU, **setting)
    sharded = _sharded(mesh, **kw)

    def single(q, d):
        return contrastive_loss(q, d, negatives=n, query_ids=qid, doc_ids=did, negative_ids=nid, guide_ids=guide, **kw)

    (v1, m1), g1 = jax.jit(jax.value_and_grad(single, argnums=(0, 1), has_aux=True))(q, d)
    (v8, m8), g8 = jax.jit(
        jax.value_and_grad(lambda q, d: sharded(q, d, n, qid, did, nid, guide), argnums=(0, 1), has_aux=True)
    )(q, d)
    np.testing.assert_allclose(float(v8), float(v1), rtol=1e-5)
    for a, b in zip(g8, g1, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for name in m1:
        np.testing.assert_allclose(float(m8[name]), float(m1[name]), rtol=1e-5, atol=1e-7, err_msg=name)
    assert float(m1["masked_fraction"]) > 0.05  # the ids really mask something
    assert float(m1["guided_fraction"]) > 0.01  # and so does the guide


def test_sharded_loss_memory_is_a_fraction_of_single_device():
    mesh = _mesh()
    B, D = 8192, 256
    shapes = [jax.ShapeDtypeStruct((B, D), jnp.float32)] * 2
    ids = jax.ShapeDtypeStruct((B,), jnp.int32)
    kw = dict(temperature=0.01, same_tower="query", bidirectional=True)

    def single(q, d):
        return contrastive_loss(q, d, **kw)[0]

    sharded = _sharded(mesh, **kw)

    def sharded_loss(q, d, qid):
        return sharded(q, d, None, qid, qid, None, None)[0]

    def temp_bytes(f, *args):
        compiled = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(*args).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    single_bytes = temp_bytes(single, *shapes)
    # Negatives=None and ids as a sharded array: shard_map needs a value for every in_spec.
    per_device = temp_bytes(sharded_loss, *shapes, ids)
    assert single_bytes > 3 * B * B * 4  # the three B x B float32 blocks really are on one device
    assert per_device < single_bytes / 4, (per_device, single_bytes)


# ----------------------------------------------------------------------------------------------
# Numerical stability and bad input.
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("tau", [0.01, 0.001])
def test_low_temperature_bfloat16_is_finite_where_naive_exp_overflows(tau):
    rng = np.random.RandomState(8)
    q = jnp.asarray(_unit(rng, 16, 32), jnp.bfloat16)
    d = jnp.asarray(_unit(rng, 16, 32), jnp.bfloat16)
    (loss, _), grads = jax.jit(
        jax.value_and_grad(
            lambda q, d: contrastive_loss(q, d, temperature=tau, same_tower="both"), argnums=(0, 1), has_aux=True
        )
    )(q, d)
    assert np.isfinite(float(loss))
    assert all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in grads)

    def naive(q, d):  # the seed-style formula: exp then sum then log, in the input precision
        qf, df = q.astype(jnp.float32), d.astype(jnp.float32)
        e_qd, e_qq = jnp.exp(qf @ df.T / tau), jnp.exp(qf @ qf.T / tau)
        denominator = e_qd.sum(1) + (e_qq * (1 - jnp.eye(16))).sum(1)
        return -jnp.mean(jnp.log(jnp.diag(e_qd) / denominator))

    # e^{s(q_i,q_i)/τ} = e^{100} (or e^{1000}) is past float32's e^{88.7}: inf, then inf·0 = NaN.
    assert not np.isfinite(float(naive(q, d)))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d=np.zeros((4, 7))), r"q and d must both be \[B, D\]; got q \(4, 8\), d \(4, 7\)"),
        (dict(negatives=np.zeros((4, 8))), r"negatives must be \[B, K, D\] = \[4, K, 8\]; got \(4, 8\)"),
        (dict(query_ids=np.zeros((3,), np.int32)), r"query_ids must have shape \(4,\); got \(3,\)"),
        (dict(doc_ids=np.zeros((4,), np.float32)), r"doc_ids must be integer ids"),
        (dict(temperature=0.0), r"temperature must be > 0; got 0.0"),
        (dict(mode="infonce"), r"mode='infonce' must be one of"),
        (dict(same_tower="queries"), r"same_tower='queries' must be one of"),
        (dict(same_tower="doc", bidirectional=False), r"bidirectional=False"),
        (dict(pair_alpha=1.5), r"pair_alpha must be in \[0, 1\]"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match):
    args = dict(q=np.zeros((4, 8), np.float32), d=np.zeros((4, 8), np.float32), temperature=0.05)
    args.update({k: (jnp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in kwargs.items()})
    q, d = jnp.asarray(args.pop("q")), jnp.asarray(args.pop("d"))
    with pytest.raises(ValueError, match=match):
        contrastive_loss(q, d, **args)
