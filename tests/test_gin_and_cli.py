"""Gin model sizes, gin errors, and the `samtone` command line (import-checkpoint, demo)."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from conftest import require_shared

from samtone_jax import main as main_module
from samtone_jax.checkpoints import load_model_gin, load_params
from samtone_jax.cli import gin_registry
from samtone_jax.cli import main as cli
from samtone_jax.config import gin_config

# Published T5.1.1 encoder sizes: (d_model, heads, d_kv, d_ff, layers).
T5_1_1 = {
    "small": (512, 6, 64, 1024, 8),
    "base": (768, 12, 64, 2048, 12),
    "large": (1024, 16, 64, 2816, 24),
    "xl": (2048, 32, 64, 5120, 24),
    "xxl": (4096, 64, 64, 10240, 24),
}


@pytest.mark.parametrize("size", sorted(T5_1_1))
def test_size_gin_files_have_t5_1_1_dimensions(size):
    gin_registry.parse([f"models/t5_1_1_{size}.gin", "architectures/ade_spl.gin"])
    model = gin_config.model()
    c = model.config
    assert (c.emb_dim, c.num_heads, c.head_dim, c.mlp_dim, c.num_layers) == T5_1_1[size]
    assert c.vocab_size == 32128 and c.mlp_activations == ("gelu", "linear")
    assert model.architecture == "ade_spl"
    if size == "base":  # parameter count without allocating: 2 towers of ~110M + projection
        from samtone_jax.checkpoints import abstract_params

        n = sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(abstract_params(model)))
        tower = 32128 * 768 + 12 * (4 * 768 * 768 + 3 * 768 * 2048 + 2 * 768) + 768 + 12 * 32
        assert n == 2 * tower + 768 * 768


def test_gin_typo_names_the_unknown_parameter():
    with pytest.raises(ValueError, match="T5Config.emb_dimm"):
        gin_registry.parse(["models/t5_1_1_tiny.gin"], ["T5Config.emb_dimm = 3"])
    with pytest.raises(ValueError, match="not found"):
        gin_registry.parse(["models/t5_1_1_nano.gin"])


def test_gin_architecture_typo_fails_when_the_model_is_built():
    gin_registry.parse(["models/t5_1_1_tiny.gin"], ["DualEncoder.architecture = 'sdee'"])
    model = gin_config.model()
    with pytest.raises(ValueError, match="DualEncoder.architecture='sdee'"):
        model.init(jax.random.PRNGKey(0), np.ones((1, 2), np.int32), np.ones((1, 2), np.int32))


RETRIEVAL_GIN = [
    "--gin_file=models/t5_1_1_tiny.gin",
    "--gin_file=architectures/sde.gin",
    "--gin.T5Config.emb_dim=4",
    "--gin.T5Config.num_heads=2",
    "--gin.T5Config.head_dim=2",
    "--gin.T5Config.mlp_dim=8",
    "--gin.T5Config.mlp_activations=('relu',)",
    "--gin.T5Config.relative_attention_num_buckets=4",
    "--gin.PROJECTION_DIM=768",
]


@pytest.mark.slow
def test_import_checkpoint_command_writes_a_loadable_checkpoint(tmp_path, capsys):
    src = require_shared("checkpoints/t5x_retrieval_de_t5_tiny_checkpoint_1000")
    dst = tmp_path / "imported"
    argv = ["import-checkpoint", "--format=t5x", f"--checkpoint={src}", f"--out={dst}", *RETRIEVAL_GIN]
    assert cli.main(argv) == 0
    assert "imported 20 variables" in capsys.readouterr().out
    params = load_params(str(dst))
    assert params["projection"]["kernel"].shape == (4, 768)
    # The saved gin rebuilds the same model.
    model = gin_config.model_from_gin_text(load_model_gin(str(dst)))
    assert model.config.emb_dim == 4 and model.projection_dim == 768
    emb = jax.jit(lambda p, t: model.apply({"params": p}, t, method=model.encode_queries))(
        params, np.array([[5, 6, 1]])
    )
    assert emb.shape == (1, 768)
    # A second import into the same place refuses instead of mixing two checkpoints.
    assert cli.main(argv) == 2
    assert "already exists" in capsys.readouterr().err


def test_failed_import_leaves_nothing_behind(tmp_path, capsys):
    src = require_shared("checkpoints/t5x_retrieval_de_t5_tiny_checkpoint_1000")
    dst = tmp_path / "imported"
    argv = ["import-checkpoint", "--format=t5x", f"--checkpoint={src}", f"--out={dst}", *RETRIEVAL_GIN[:-1]]
    assert cli.main(argv) == 2  # projection 768 in the source, 4 in the gin config
    assert "DualEncoder.projection_dim = 768" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_t5x_style_entry_point_routes_to_the_modes(capsys):
    assert main_module.main([]) == 2
    argv = ["--run_mode=train", "--gin_file=models/t5_1_1_tiny.gin", "--gin_file=runs/finetune_multireqa.gin"]
    assert main_module.main(argv) == 2
    assert "MODEL_DIR" in capsys.readouterr().err  # the train mode ran and named the missing macro


@pytest.mark.slow
def test_demo_end_to_end_at_test_size(tmp_path, monkeypatch, capsys):
    from samtone_jax.cli import demo
    from samtone_jax.data import wordnet

    if not os.path.exists(os.path.join(wordnet.DEFAULT_DIR, "data.noun")):
        pytest.skip(f"{wordnet.DEFAULT_DIR} absent: apt-get install wordnet-base (make wordnet)")
    monkeypatch.delenv("WORDNET_DIR", raising=False)
    bindings = ["TRAIN_STEPS = 4", "BATCH_SIZE = 8", "schedule.log_every = 2", "schedule.checkpoint_every = 2"]
    model_dir = str(tmp_path / "demo")
    kwargs = dict(eval_queries=20, candidates=200, vocab_size=500, vocab_texts=20_000, model_dir=model_dir)
    assert demo.main((), bindings, tower="t5", **kwargs) == 0
    out = capsys.readouterr().out
    assert "step 4/4" in out and "BM25 (bm25s)" in out and "T5.1.1 mini SDE, untrained" in out
    results = json.load(open(tmp_path / "demo" / "eval.json"))
    assert results["step"] == 4 and results["queries"] == 20 and results["corpus"] == 200
    for system in results["results"].values():
        assert 0.0 <= system["P@1"] <= system["RR"] <= 1.0
        assert "R@1000" not in system  # a top-100 run cannot measure it
    assert (tmp_path / "demo" / "vocab.model").exists() and (tmp_path / "demo" / "train").is_dir()


@pytest.mark.parametrize(
    "gin_file,explicit",
    [
        ("in_batch", dict(mode="samtone", same_tower="none", bidirectional=False)),
        ("bidirectional", dict(mode="samtone", same_tower="none", bidirectional=True)),
        ("samtone_query", dict(mode="samtone", same_tower="query", bidirectional=True)),
        ("samtone_doc", dict(mode="samtone", same_tower="doc", bidirectional=True)),
        ("samtone_both", dict(mode="samtone", same_tower="both", bidirectional=True)),
        ("pair", dict(mode="pair", same_tower="none", bidirectional=False, pair_alpha=0.1)),
        ("gte_icl", dict(mode="gte")),
    ],
)
def test_loss_gin_files_configure_the_loss_they_name(gin_file, explicit):
    from samtone_jax.objectives.losses import contrastive_loss

    rng = np.random.RandomState(0)
    q, d = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in rng.normal(size=(2, 6, 8)).astype(np.float32))
    gin_registry.parse([f"losses/{gin_file}.gin"])
    configured, _ = gin_config.contrastive_loss(q, d)
    direct, _ = contrastive_loss(q, d, temperature=0.01, **explicit)
    np.testing.assert_allclose(float(configured), float(direct), rtol=1e-6)
    # Each file describes a different loss: none of them equals plain in-batch unless it is it.
    baseline, _ = contrastive_loss(q, d, temperature=0.01, mode="samtone", same_tower="none", bidirectional=False)
    assert (abs(float(configured) - float(baseline)) < 1e-6) == (gin_file == "in_batch")


def test_a_gin_include_under_a_folder_the_working_directory_also_has(tmp_path, monkeypatch):
    """A gin file that includes 'runs/finetune_minilm.gin'; after `make demo` the working directory
    has a runs/ folder, which Python sees as a namespace package, and gin's package-file check then
    raised TypeError instead of going on to gin_configs/ (gin_config._tolerant)."""
    import sys

    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("runs", None)
    mine = tmp_path / "mine.gin"
    mine.write_text("include 'runs/finetune_minilm.gin'\ntrain.task = 'wordnet_definitions'\n")
    gin_registry.parse([str(mine)], [])
    import gin

    assert gin.query_parameter("train.task") == "wordnet_definitions"
    assert gin.query_parameter("TRAIN_STEPS/macro.value") == 500  # from the included file
