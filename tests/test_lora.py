"""LoRA adapters (models/lora.py) on T5 and BERT towers: an adapter starts at zero and merges into the
weights it adds to; the step trains the adapters only (the base bit-identical, no optimizer state for
it); GradCache = plain and 8 devices = 1 with adapters; a run from an import loads, exports merged
and reloads equal; the refusals."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_bert_train_argv

from samtone_jax.config import gin_config
from samtone_jax.core.errors import BadValueError
from samtone_jax.models import init_params, partitioning
from samtone_jax.models import lora as lora_lib
from samtone_jax.models.bert import BertConfig
from samtone_jax.models.dual_encoder import DualEncoder
from samtone_jax.models.t5 import T5Config
from samtone_jax.training import optimizer, train

TOWERS = {
    "t5": T5Config(vocab_size=50, emb_dim=16, num_heads=2, head_dim=8, num_layers=2, mlp_dim=24),
    "bert": BertConfig(vocab_size=50, emb_dim=16, num_heads=2, head_dim=8, num_layers=2, mlp_dim=24, max_length=16),
}
TOKENS = jnp.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 10], [11, 0, 0, 0, 0]])


def _params(model, seed=0):
    return nn.unbox(init_params(model, jax.random.PRNGKey(seed)))


def _moved(params, scale=0.3):
    """Every adapter's B drawn away from zero (as training would move it)."""

    def move(path, x):
        if path[-1].key != "b":
            return x
        return x + scale * jax.random.normal(jax.random.PRNGKey(hash(jax.tree_util.keystr(path)) % 2**31), x.shape)

    return jax.tree_util.tree_map_with_path(move, params)


def _embed(model, params):
    q = model.apply({"params": params}, TOKENS, method=model.encode_queries)
    d = model.apply({"params": params}, TOKENS, method=model.encode_documents)
    return np.asarray(q), np.asarray(d)


@pytest.mark.parametrize("tower", list(TOWERS))
@pytest.mark.parametrize("architecture", ["sde", "ade_lora"])
def test_an_adapter_starts_at_zero_and_merges_into_the_weights_it_adds_to(tower, architecture):
    model = DualEncoder(TOWERS[tower], architecture=architecture, lora_rank=4, lora_alpha=8.0)
    params = _params(model)
    plain = DualEncoder(TOWERS[tower], architecture="sde")
    base = {"encoder": params["encoder"], "projection": params["projection"]}
    # B = 0: the adapted model embeds exactly as its base, on both sides.
    for ours, theirs in zip(_embed(model, params), _embed(plain, base), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    # Moved adapters change the embeddings; merged into the weights (W + s·A·B) they embed the same.
    moved = _moved(params)
    q, d = _embed(model, moved)
    assert np.abs(q - _embed(plain, base)[0]).max() > 1e-2
    merged_model, merged = lora_lib.merge(model, moved)
    assert merged_model.lora_rank == 0
    assert merged_model.architecture == {"sde": "sde", "ade_lora": "ade_spl"}[architecture]
    assert not any("adapter" in k for k in merged)
    mq, md = _embed(merged_model, merged)
    np.testing.assert_allclose(mq, q, atol=2e-6)
    np.testing.assert_allclose(md, d, atol=2e-6)
    if architecture == "ade_lora":  # one base, one adapter per side: the sides now differ
        assert np.abs(q - d).max() > 1e-2
        assert set(params) == {"encoder", "query_adapter", "document_adapter", "projection"}
    else:
        np.testing.assert_array_equal(q, d)
        assert set(params) == {"encoder", "adapter", "projection"}


@pytest.mark.parametrize("architecture", ["sde", "ade_lora"])
def test_a_scaled_merge_is_the_model_with_its_adapters_update_scaled(architecture):
    """merge(..., adapter_scale=γ) embeds as the LoRA model whose every B is γ·B (the adapter path, not
    the merge); γ = 0 gives the frozen base's towers bit for bit; a bad γ is refused."""
    model = DualEncoder(TOWERS["bert"], architecture=architecture, lora_rank=4, lora_alpha=8.0)
    moved = _moved(_params(model))
    for gamma in (0.0, 0.4):
        scaled_b = jax.tree_util.tree_map_with_path(lambda p, x, g=gamma: x * g if p[-1].key == "b" else x, moved)
        merged_model, merged = lora_lib.merge(model, moved, adapter_scale=gamma)
        for ours, theirs in zip(_embed(merged_model, merged), _embed(model, scaled_b), strict=True):
            np.testing.assert_allclose(ours, theirs, atol=2e-6)
    _, at_zero = lora_lib.merge(model, moved, adapter_scale=0.0)
    base = moved["encoder"]
    towers = [at_zero[k] for k in at_zero if k != "projection"]
    for tower in towers:
        for a, b in zip(jax.tree_util.tree_leaves(tower), jax.tree_util.tree_leaves(base), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(BadValueError, match="--adapter_scale must be a finite number >= 0"):
        lora_lib.merge(model, moved, adapter_scale=-0.5)
    plain = DualEncoder(TOWERS["bert"], architecture="sde")
    with pytest.raises(BadValueError, match="no LoRA adapters to scale"):
        lora_lib.merge(plain, _params(plain), adapter_scale=0.5)


def test_the_factors_have_the_rank_the_targets_and_the_layers_asked_for():
    config = TOWERS["t5"]
    every = _params(DualEncoder(config, lora_rank=3))["adapter"]
    # T5.1.1: query, key, value, out, wi_0, wi_1, wo in each of 2 layers.
    assert len(every) == 14
    assert every["layers_0.attention.query"]["a"].shape == (16, 3)
    assert every["layers_0.attention.query"]["b"].shape == (3, 2, 8)
    assert every["layers_1.attention.out"]["a"].shape == (2, 8, 3)
    assert every["layers_1.mlp.wo"]["b"].shape == (3, 16)
    assert all(not np.any(f["b"]) for f in every.values())
    some = _params(DualEncoder(config, lora_rank=2, lora_targets=("value", "mlp"), lora_layers=(1,)))["adapter"]
    assert sorted(some) == ["layers_1.attention.value", "layers_1.mlp.wi_0", "layers_1.mlp.wi_1", "layers_1.mlp.wo"]
    bert = _params(DualEncoder(TOWERS["bert"], lora_rank=2, lora_targets=("attention",)))["adapter"]
    assert sorted(bert) == [f"layers_{i}.attention.{k}" for i in (0, 1) for k in ("key", "out", "query", "value")]


@pytest.mark.parametrize("tower", list(TOWERS))
def test_scanned_and_rematerialised_layers_apply_the_same_adapters(tower):
    model = DualEncoder(TOWERS[tower], architecture="ade_lora", lora_rank=4)
    params = _moved(_params(model))
    scanned = model.clone(config=dataclasses.replace(TOWERS[tower], scan_layers=True, remat=True))
    for ours, theirs in zip(_embed(scanned, params), _embed(model, params), strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"architecture": "ade", "lora_rank": 4}, "LoRA adapts 'sde'"),
        ({"architecture": "ade_spl", "lora_rank": 4}, "LoRA adapts 'sde'"),
        ({"architecture": "ade_lora"}, "set DualEncoder.lora_rank"),
        ({"lora_rank": -2}, "lora_rank must be a positive integer"),
        ({"lora_rank": 4, "lora_alpha": 0.0}, "lora_alpha must be > 0"),
        ({"lora_rank": 4, "lora_targets": ("attn",)}, "lora_targets=('attn',)"),
        ({"lora_rank": 4, "lora_layers": (7,)}, "adapt no kernel of the 2-layer tower"),
        # a kernel another family declares (ModernBERT's fused qkv): T5's tower has none
        ({"lora_rank": 4, "lora_targets": ("qkv",)}, "lora_targets=('qkv',) with lora_layers=None adapt no kernel"),
    ],
)
def test_what_lora_refuses_is_named(fields, message):
    with pytest.raises(BadValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _params(DualEncoder(TOWERS["t5"], **fields))


def test_scanned_layers_refuse_adapters_on_some_layers_only():
    config = dataclasses.replace(TOWERS["bert"], scan_layers=True)
    with pytest.raises(BadValueError, match="lora_layers must be None"):
        _params(DualEncoder(config, lora_rank=2, lora_layers=(0,)))


def _batch(batch=16, vocab=50):
    from samtone_jax.training import train_batches

    rng = np.random.RandomState(0)
    out = {
        "query_tokens": rng.randint(2, vocab, size=(batch, 7)).astype(np.int32),
        "doc_tokens": rng.randint(2, vocab, size=(batch, 9)).astype(np.int32),
        "query_id": np.arange(batch, dtype=np.int64),
        "doc_id": np.arange(batch, dtype=np.int64),
    }
    out["query_tokens"][:, 5:] = 0
    return train_batches.model_features(out)


def _step(model, mesh, chunk=None, ema=False, rules=partitioning.DEFAULT_RULES):
    """(initial state, state after one step, metrics) of `model` on mesh with the samtone loss."""
    tx, schedule = optimizer.adafactor(learning_rate=1e-2, train_steps=10, adapters=True)
    state = train.initial_state(model, tx, mesh, seed=0, init_checkpoint=None, ema=ema, rules=rules)
    before = jax.device_get(state)
    step = jax.jit(
        train.make_train_step(
            model, tx, schedule, mesh, chunk, gin_config.contrastive_loss, ema_decay=0.5 if ema else None
        )
    )
    with partitioning.activation_sharding(mesh, rules):
        new_state, metrics = step(state, partitioning.host_to_global(mesh, _batch()))
    return before, jax.device_get(new_state), jax.device_get(metrics)


@pytest.fixture
def samtone_loss():
    from samtone_jax.cli import gin_registry

    gin_registry.parse(["losses/samtone_query.gin"], ["TEMPERATURE = 0.05"])


def _model(tower="bert", architecture="ade_lora", dropout=0.0):
    config = dataclasses.replace(TOWERS[tower], dropout_rate=dropout)
    return DualEncoder(config, architecture=architecture, lora_rank=4, projection_init="identity")


def test_a_step_trains_the_adapters_and_projection_only_and_keeps_no_state_for_the_base(samtone_loss):
    model = _model()
    mesh = partitioning.create_mesh(devices=jax.devices()[:1])
    before, after, metrics = _step(model, mesh, ema=True)
    assert np.isfinite(metrics["loss"])
    # The base tower is held apart from what is trained (checkpoints leave it out) and stays bit-identical.
    assert set(before["params"]) == {"query_adapter", "document_adapter", "projection"}
    assert set(before["frozen"]) == {"encoder"}
    for a, b in zip(*(jax.tree_util.tree_leaves(s["frozen"]) for s in (after, before)), strict=True):
        np.testing.assert_array_equal(a, b)
    for key in ("query_adapter", "document_adapter", "projection"):
        moved = [
            np.abs(a - b).max()
            for a, b in zip(*(jax.tree_util.tree_leaves(s["params"][key]) for s in (after, before)), strict=True)
        ]
        assert max(moved) > 1e-4, key
    # The optimizer state and the moving average cover the trained parameters only.
    tx, _ = optimizer.adafactor(learning_rate=1e-2, train_steps=10)
    everything = before["params"] | before["frozen"]
    full = sum(x.size for x in jax.tree_util.tree_leaves(jax.eval_shape(tx.init, everything)))
    assert sum(x.size for x in jax.tree_util.tree_leaves(before["opt_state"])) < full / 2
    base_shapes = {tuple(x.shape) for x in jax.tree_util.tree_leaves(before["frozen"]) if x.ndim == 2}
    trained_shapes = {tuple(x.shape) for x in jax.tree_util.tree_leaves(before["params"])}
    assert not base_shapes & ({tuple(x.shape) for x in jax.tree_util.tree_leaves(before["opt_state"])} - trained_shapes)
    assert set(after["ema"]) == set(before["params"])


@pytest.mark.slow
def test_with_adapters_fsdp_and_grad_cache_equal_the_plain_step(samtone_loss):
    """GradCache on 8 devices under FSDP (every parameter with an embed dimension, the adapters'
    factors too, split over them) = the plain step on one device. BERT towers, dropout on; the
    adapters' forward is the towers' shared dense.low_rank, whose T5 use the merge test checks."""
    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    model = _model("bert", "sde", dropout=0.1)
    _, plain, m1 = _step(model, partitioning.create_mesh(devices=jax.devices()[:1]))
    _, cached, mc = _step(model, partitioning.create_mesh(), chunk=1, rules=partitioning.FSDP_RULES)
    np.testing.assert_allclose(mc["loss"], m1["loss"], rtol=1e-5)
    for a, b in zip(
        jax.tree_util.tree_leaves(cached["params"]), jax.tree_util.tree_leaves(plain["params"]), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_a_lora_run_saves_no_base_resumes_exactly_loads_exports_merged_and_reloads_equal(
    wordnet_env, tiny_bert_import, tmp_path, capsys
):
    """import (a tiny BERT) -> samtone train of an ade_lora (packed, fresh adapters over the import):
    its checkpoints hold no base tower, base.json names the import; a resume from step 2 (the base
    read again from base.json) ends bit-identical to 3 steps straight -> samtone_jax.load of the run;
    the adapter export and the soup of the two runs load like it -> sentence-transformers export,
    merged into two towers -> loads back equal, both sides."""
    import json
    import shutil

    import samtone_jax
    from samtone_jax.checkpoints.train_checkpoints import restore_on_one_device
    from samtone_jax.cli import main as cli

    straight, resumed, out = tmp_path / "straight", tmp_path / "resumed", tmp_path / "export"
    extra = ["--gin.DualEncoder.architecture='ade_lora'", "--gin.DualEncoder.lora_rank=4"]
    extra += ["--gin.adafactor.learning_rate=0.05"]
    every = [*extra, "--gin.schedule.checkpoint_every=1"]
    assert cli.main(tiny_bert_train_argv(resumed, tiny_bert_import, steps=3, extra=every)) == 0
    shutil.copytree(resumed, straight)  # the 3 steps straight
    shutil.rmtree(resumed / "checkpoints" / "3")  # as if preempted after step 2's checkpoint
    capsys.readouterr()
    assert cli.main(tiny_bert_train_argv(resumed, tiny_bert_import, steps=3, extra=every)) == 0
    log = capsys.readouterr().out
    assert "step 3/3" in log and "step 1/3" not in log  # it resumed
    saved = restore_on_one_device(straight / "checkpoints" / "3" / "state")
    assert set(saved["params"]) == {"query_adapter", "document_adapter", "projection"}  # no frozen tower
    recorded = json.loads((straight / "base.json").read_text())
    assert recorded["path"] == str(tiny_bert_import[1]) and len(recorded["fingerprint"]) == 16
    again = restore_on_one_device(resumed / "checkpoints" / "3" / "state")
    for a, b in zip(jax.tree_util.tree_leaves(again), jax.tree_util.tree_leaves(saved), strict=True):
        np.testing.assert_array_equal(a, b)

    texts = ["a small dog", "the act of running", "an organ of the body"]
    ours = samtone_jax.load(str(straight))
    q, d = ours.encode_queries(texts), ours.encode_documents(texts)
    assert np.abs(q - d).max() > 1e-4  # the two adapters moved apart
    # The adapters alone, and a soup of the two identical runs: the trained part and base.json, loading
    # like the run.
    adapter, soup = tmp_path / "adapter", tmp_path / "soup"
    assert cli.main(["export", f"--checkpoint={straight}", "--format=adapter", f"--out={adapter}"]) == 0
    assert cli.main(["average", "--checkpoint", str(straight), str(resumed), f"--out={soup}"]) == 0
    for folder in (adapter, soup):
        assert (folder / "base.json").read_text() == (straight / "base.json").read_text()
        assert set(restore_on_one_device(folder / "params")) == set(saved["params"])
        loaded = samtone_jax.load(str(folder))
        np.testing.assert_allclose(loaded.encode_queries(texts), q, atol=1e-6)
        np.testing.assert_allclose(loaded.encode_documents(texts), d, atol=1e-6)
    # The adapter export as INIT_CHECKPOINT: its adapters continue over the same frozen tower.
    again = tmp_path / "again"
    more = [*extra, f"--gin.train.init_checkpoint='{adapter}'", "--gin.adafactor.learning_rate=0.0"]
    assert cli.main(tiny_bert_train_argv(again, tiny_bert_import, steps=1, extra=more)) == 0
    assert (again / "base.json").read_text() == (straight / "base.json").read_text()
    np.testing.assert_allclose(samtone_jax.load(str(again)).encode_queries(texts), q, atol=1e-6)  # lr 0: unchanged
    assert cli.main(["export", f"--checkpoint={straight}", "--format=sentence-transformers", f"--out={out}"]) == 0
    back = samtone_jax.load(str(out))
    assert back.architecture == "ade_spl"
    np.testing.assert_allclose(back.encode_queries(texts), q, atol=1e-5)
    np.testing.assert_allclose(back.encode_documents(texts), d, atol=1e-5)
    # --adapter_scale 0.5: the merge of the scaled update, recorded; the plain adapter export refuses it.
    half = tmp_path / "half"
    argv = ["export", f"--checkpoint={straight}", "--format=sentence-transformers", "--adapter_scale=0.5"]
    assert cli.main([*argv, f"--out={half}"]) == 0
    assert json.loads((half / "samtone.json").read_text())["source"]["adapter_scale"] == 0.5
    expected = samtone_jax.load(str(straight)).merged(0.5).encode_queries(texts)
    np.testing.assert_allclose(samtone_jax.load(str(half)).encode_queries(texts), expected, atol=1e-5)
    assert np.abs(expected - q).max() > 1e-3  # the scale changed the model
    argv = ["export", f"--checkpoint={straight}", "--format=adapter", "--adapter_scale=0.5"]
    assert cli.main([*argv, f"--out={tmp_path / 'x'}"]) == 2


def test_a_lora_run_needs_its_base_named_and_a_checkpoint_without_one_is_refused(tmp_path):
    from samtone_jax.checkpoints import reader
    from samtone_jax.core.errors import MissingFileError
    from samtone_jax.training import start_checks

    model = DualEncoder(TOWERS["bert"], lora_rank=2)
    with pytest.raises(BadValueError, match="name that tower's checkpoint in train.init_checkpoint"):
        start_checks.lora_base(model, None, tmp_path / "run")
    assert start_checks.lora_base(DualEncoder(TOWERS["bert"]), None, tmp_path / "run") is None
    trained = {"adapter": {}, "projection": {}}
    with pytest.raises(MissingFileError, match="no base.json naming where that tower is"):
        reader.with_base(trained, model, tmp_path)
    (tmp_path / "base.json").write_text("{not json")
    with pytest.raises(BadValueError, match="base.json is damaged"):
        reader.with_base(trained, model, tmp_path)


@pytest.mark.parametrize("in_dims, in_shape, out_shape", [(1, (6,), (3, 4)), (2, (3, 4), (6,)), (2, (3, 4), (2, 3))])
def test_the_low_rank_terms_gradient_equals_autodiff_of_b_a_x_plain_and_per_example(in_dims, in_shape, out_shape):
    # dense.low_rank's hand-written backward (every dot reads the cotangent as laid out) against
    # jax.grad of the plain product, for a batch and under the per-example vmap training encodes with.
    from samtone_jax.models.dense import dense, low_rank

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(keys[0], (5, 7, *in_shape))
    adapter = {"k": {"a": jax.random.normal(keys[1], (*in_shape, 2)), "b": jax.random.normal(keys[2], (2, *out_shape))}}

    def ours(x, adapter):
        return jnp.sin(low_rank(x, adapter, "k", jnp.float32, in_dims)).sum()

    def plain(x, adapter):
        return jnp.sin(dense(dense(x, adapter["k"]["a"], in_dims), adapter["k"]["b"])).sum()

    def per_example(f):
        return lambda x, adapter: jax.vmap(lambda xi: f(xi[None], adapter))(x).sum()

    for wrap in (lambda f: f, per_example):
        got = jax.grad(wrap(ours), argnums=(0, 1))(x, adapter)
        want = jax.grad(wrap(plain), argnums=(0, 1))(x, adapter)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert low_rank(x, adapter, "other", jnp.float32, in_dims) == 0.0
