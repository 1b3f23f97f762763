"""The parameters' exponential moving average (step.ema_decay): the update rule between saved
steps, a resume that ends bit-identical to the straight run, the in-training eval of both weights,
the export of the average, and the refusals."""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from conftest import tiny_train_argv

import samtone_jax
from samtone_jax.checkpoints.train_checkpoints import restore_on_one_device
from samtone_jax.cli import main as cli
from samtone_jax.core.errors import BadValueError, MissingFileError

DECAY = 0.5  # large steps of the average, so a wrong rule shows


def _state(run, step):
    return restore_on_one_device(run / "checkpoints" / str(step) / "state")


def _leaves(tree):
    return jax.tree_util.tree_leaves(tree)


@pytest.mark.slow
def test_moving_average_rule_resume_eval_and_export(wordnet_env, tmp_path, capsys):
    run = tmp_path / "run"
    extra = [
        f"--gin.step.ema_decay={DECAY}",
        "--gin.schedule.checkpoint_every=1",
        "--gin.schedule.keep_checkpoints=5",
        "--gin.schedule.eval_every=2",
        "--gin.train_eval.retrieval_task='wordnet_definitions'",
        "--gin.train_eval.retrieval_split='all'",
    ]
    assert cli.main(tiny_train_argv(run, wordnet_env[1], steps=4, extra=extra)) == 0
    out = capsys.readouterr().out
    assert "ema/retrieval/P@1" in out and "retrieval/P@1" in out  # both weights evaluated
    states = {step: _state(run, step) for step in (2, 3, 4)}
    for step in (3, 4):  # ema_N = d · ema_{N-1} + (1 - d) · params_N
        for e, before, p in zip(
            _leaves(states[step]["ema"]), _leaves(states[step - 1]["ema"]), _leaves(states[step]["params"]), strict=True
        ):
            np.testing.assert_allclose(e, DECAY * before + (1 - DECAY) * p, rtol=1e-6, atol=1e-7)
    assert any(
        not np.array_equal(e, p) for e, p in zip(_leaves(states[4]["ema"]), _leaves(states[4]["params"]), strict=True)
    )
    # resumed from step 2: bit-identical params and average at step 4
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed, ignore=shutil.ignore_patterns("3", "4", "eval", "train"))
    assert cli.main(tiny_train_argv(resumed, wordnet_env[1], steps=4, extra=extra)) == 0
    for key in ("params", "ema"):
        for a, b in zip(_leaves(_state(resumed, 4)[key]), _leaves(states[4][key]), strict=True):
            np.testing.assert_array_equal(a, b)
    # served: load(weights='ema') and the export of the average
    texts = ["a small dog", "the bank of a river"]
    averaged = samtone_jax.load(str(run), weights="ema")
    raw = samtone_jax.load(str(run))
    assert not np.allclose(averaged.encode_queries(texts), raw.encode_queries(texts), atol=1e-4)
    export = tmp_path / "export"
    assert cli.main(["export", f"--checkpoint={run}", "--format=hf", f"--out={export}", "--weights=ema"]) == 0
    np.testing.assert_allclose(
        samtone_jax.load(str(export)).encode_queries(texts), averaged.encode_queries(texts), atol=2e-6
    )
    assert "moving average of its parameters" in (export / "README.md").read_text()
    # eval of the average: its own record, beside the raw weights' (not over it), equal to the export's
    flags = ["--task=wordnet_definitions", "--split=all"]
    assert cli.main(["eval", f"--checkpoint={run}", *flags, "--weights=ema"]) == 0
    assert cli.main(["eval", f"--checkpoint={run}", *flags]) == 0
    assert cli.main(["eval", f"--checkpoint={export}", *flags]) == 0
    records = {p.name: json.loads(p.read_text()) for p in (run / "eval").glob("*.json")}
    ema_record = records["wordnet_definitions_all_step4_ema.json"]
    assert ema_record["weights"] == "ema" and "weights" not in records["wordnet_definitions_all_step4.json"]
    exported = json.loads((export / "eval" / "wordnet_definitions_all_step4.json").read_text())  # its source's step
    assert ema_record["metrics"]["RR"] == pytest.approx(exported["metrics"]["RR"], abs=1e-6)
    # refusals: turning the average off on resume, EMA weights of a folder without them
    assert cli.main(tiny_train_argv(run, wordnet_env[1], steps=5, extra=extra[1:])) == 2
    assert "saved with a moving average of the parameters" in capsys.readouterr().err
    with pytest.raises(BadValueError, match="needs a training run"):
        samtone_jax.load(str(export), weights="ema")


def test_a_decay_outside_0_1_and_ema_weights_of_a_run_without_them_are_refused(
    trained_run, wordnet_env, tmp_path, capsys
):
    model_dir = tmp_path / "run"
    assert cli.main(tiny_train_argv(model_dir, wordnet_env[1], extra=["--gin.step.ema_decay=1.5"])) == 2
    assert "step.ema_decay must lie in (0, 1)" in capsys.readouterr().err
    assert not model_dir.exists()
    with pytest.raises(MissingFileError, match="trained without step.ema_decay"):
        samtone_jax.load(str(trained_run), weights="ema")


@pytest.mark.slow
def test_the_average_of_bfloat16_parameters_is_kept_in_float32(wordnet_env, tmp_path):
    """bfloat16 cannot hold 0.999 · e + 0.001 · p (the spacing near 1 is 2^-7): the average would
    never move. It is kept in float32 and served in the parameters' dtype."""
    run = tmp_path / "run"
    extra = ["--gin.step.ema_decay=0.999", "--gin.T5Config.param_dtype='bfloat16'"]
    assert cli.main(tiny_train_argv(run, wordnet_env[1], steps=2, extra=extra)) == 0
    state = _state(run, 2)
    assert {x.dtype for x in _leaves(state["ema"])} == {np.dtype(np.float32)}
    assert {x.dtype for x in _leaves(state["params"])} == {np.dtype(jax.numpy.bfloat16)}
    moved = [
        np.abs(e - p.astype(np.float32)).max()
        for e, p in zip(_leaves(state["ema"]), _leaves(state["params"]), strict=True)
    ]
    assert max(moved) > 0  # not the parameters themselves
    texts = ["a small dog"]
    assert samtone_jax.load(str(run), weights="ema").encode_queries(texts).shape == (1, 32)
