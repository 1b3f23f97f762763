"""Runs saved by the previous release still load, resume, evaluate and export: train.* was grouped
into schedule.* / inputs.* / packing.* / train_eval.* / objective.* / step.* (training/settings.py),
and config/renamed.py reads the old names as the new ones."""

from __future__ import annotations

import inspect

import gin
import pytest

# A run's config.gin exactly as the previous release (commit 085c64c, before the grouping) wrote it
# for a tiny SDE trained 2 steps with packing, a moving average, Matryoshka and an in-training eval.
PREVIOUS_CONFIG_GIN = """\
# Macros:
# ==============================================================================
ACTIVATION_DTYPE = 'float32'
DROPOUT_RATE = 0.0
PROJECTION_DIM = None
TEMPERATURE = 0.05
VOCAB_SIZE = 100

# Parameters for contrastive_loss:
# ==============================================================================
contrastive_loss.bidirectional = True
contrastive_loss.mode = 'samtone'
contrastive_loss.same_tower = 'query'
contrastive_loss.same_tower_weight = 1.0
contrastive_loss.temperature = %TEMPERATURE

# Parameters for create_mesh:
# ==============================================================================
create_mesh.num_devices = 1

# Parameters for DualEncoder:
# ==============================================================================
DualEncoder.architecture = 'sde'
DualEncoder.projection_dim = %PROJECTION_DIM

# Parameters for T5Config:
# ==============================================================================
T5Config.dropout_rate = %DROPOUT_RATE
T5Config.dtype = %ACTIVATION_DTYPE
T5Config.emb_dim = 32
T5Config.head_dim = 8
T5Config.mlp_activations = ('gelu', 'linear')
T5Config.mlp_dim = 64
T5Config.num_heads = 4
T5Config.num_layers = 2
T5Config.relative_attention_max_distance = 128
T5Config.relative_attention_num_buckets = 32
T5Config.vocab_size = %VOCAB_SIZE

# Parameters for train:
# ==============================================================================
train.batch_size = 8
train.checkpoint_every = 1
train.data_shards = 1
train.doc_length = 12
train.ema_decay = 0.9
train.eval_batches = 1
train.eval_every = 2
train.eval_split = 'all'
train.id_masking = True
train.keep_checkpoints = 2
train.log_every = 1
train.matryoshka_dims = (16, 32)
train.model_dir = '{model_dir}'
train.packing = True
train.packing_max_segments = 4
train.query_length = 8
train.shuffle_block_size = 1
train.split = 'all'
train.task = 'wordnet_definitions'
train.train_steps = 2
train.vocabulary = '{vocabulary}'
"""


def test_train_takes_at_most_15_parameters():
    from samtone_jax.training import train

    assert len(inspect.signature(train.train).parameters) <= 15


def test_every_renamed_setting_is_a_real_gin_parameter_and_gone_from_train():
    from samtone_jax.cli import gin_registry  # noqa: F401  every configurable registered
    from samtone_jax.config.renamed import RENAMED
    from samtone_jax.training import train

    now = set(inspect.signature(train.train).parameters)
    for old, new in RENAMED.items():
        configurable, parameter = new.split(".")
        assert parameter in inspect.signature(gin.get_configurable(configurable)).parameters, new
        assert old.split(".")[1] not in now, f"{old} is still train's: it cannot be renamed"


def test_renaming_touches_selectors_only():
    from samtone_jax.config import renamed

    text = "train.packing = True\nscope/train.log_every = 5\ntrain.task = 'train.split'\n  train.split = %SPLIT\n"
    assert renamed.text(text) == (
        "packing.enabled = True\nscope/schedule.log_every = 5\ntrain.task = 'train.split'\n  inputs.split = %SPLIT\n"
    )
    assert renamed.binding("train.ema_decay=0.9") == "step.ema_decay=0.9"
    assert renamed.keys({"train.eval_split": "a", "train_eval.split": "b", "train.task": "t"}) == {
        "train_eval.split": "b",
        "train.task": "t",
    }


@pytest.fixture(scope="module")
def previous_run(wordnet_data, tmp_path_factory):
    """A run trained 2 steps by the previous release's config.gin, holding that text as its config.gin
    (the checkpoints' format did not change between the releases)."""
    from samtone_jax.cli import main as cli

    wn, vocab = wordnet_data
    run = tmp_path_factory.mktemp("previous") / "run"
    old = PREVIOUS_CONFIG_GIN.format(model_dir=run, vocabulary=vocab)
    given = run.parent / "previous_config.gin"
    given.write_text(old)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORDNET_DIR", str(wn))
        assert cli.main(["train", f"--gin_file={given}"]) == 0  # a user's gin file in the old names
    assert "schedule.checkpoint_every = 1" in (run / "config.gin").read_text()  # written in today's
    (run / "config.gin").write_text(old)
    return run


def test_previous_run_loads_with_its_settings(previous_run):
    import numpy as np

    import samtone_jax

    model = samtone_jax.load(str(previous_run))
    assert model.matryoshka_dims == (16, 32)  # objective.matryoshka_dims, read from train.matryoshka_dims
    assert model.training_lengths == (8, 12)
    ema = samtone_jax.load(str(previous_run), weights="ema")  # refused without step.ema_decay
    a, b = model.encode_queries(["a dog"]), ema.encode_queries(["a dog"])
    assert a.shape == b.shape == (1, 32) and not np.allclose(a, b)


def test_previous_run_resumes_evaluates_and_exports(previous_run, wordnet_data, monkeypatch):
    from samtone_jax.cli import main as cli
    from samtone_jax.core import run_folders

    monkeypatch.setenv("WORDNET_DIR", str(wordnet_data[0]))
    config = previous_run / "config.gin"
    # Resumed with its own config.gin: the data settings compare equal across the two names.
    assert cli.main(["train", f"--gin_file={config}", "--gin.train.train_steps=3"]) == 0
    assert run_folders.complete_steps(previous_run)[-1] == 3
    assert "inputs.split = 'all'" in config.read_text()
    history = "".join(p.read_text() for p in (previous_run / "config_history").iterdir())
    assert "train.packing_max_segments = 4" in history  # the old text kept
    assert cli.main(["eval", f"--checkpoint={previous_run}", "--task=wordnet_definitions", "--split=all"]) == 0
    out = previous_run.parent / "export"
    argv = ["export", f"--checkpoint={previous_run}", "--format=sentence-transformers", f"--out={out}", "--weights=ema"]
    assert cli.main(argv) == 0
    assert (out / "modules.json").exists()
