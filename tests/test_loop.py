"""loop.py, the loop every training mode runs: resume, SIGTERM, the non-finite stop, the lock and
the configs, first on a toy mode (a few milliseconds a step), then through both real modes
(`samtone train`, `samtone train-adore`) in this process."""

from __future__ import annotations

import functools
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from samtone_jax.core import paths
from samtone_jax.core.errors import BadValueError
from samtone_jax.core.run_lock import RunLockedError
from samtone_jax.training import loop
from samtone_jax.training.train_logging import NonFiniteLossError, ProgressLogger

TARGETS = np.arange(40, dtype=np.float32).reshape(10, 4)  # the toy's "data": one row a step


def _toy(seen, nan_at=None, sigterm_at=None, inf_grad_at=None):
    """(init_state, batches, step): w moves halfway to each step's target row."""

    def init_state(fresh):
        return {"step": jnp.zeros((), jnp.int32), "params": {"w": jnp.zeros(4, jnp.float32)}}

    def batches(start):
        seen.append(start)
        for row in range(start, len(TARGETS)):
            yield jnp.asarray(TARGETS[row])

    def step(state, target):
        number = int(state["step"]) + 1
        w = state["params"]["w"] + 0.5 * (target - state["params"]["w"])
        loss = jnp.sum(jnp.square(w - target))
        if number == nan_at:
            loss = loss * jnp.nan
        if number == sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        grad_norm = jnp.float32(jnp.inf if number == inf_grad_at else 1.0)
        return {"step": state["step"] + 1, "params": {"w": w}}, {
            "loss": loss,
            "accuracy": jnp.float32(0),
            "grad_norm": grad_norm,
        }

    return init_state, batches, step


def _run(model_dir, steps=6, pause_at=0, evaluated=None, **toy):
    seen = []
    every = 3 if evaluated is not None else 0
    schedule = loop.Schedule(
        train_steps=steps, global_batch=1, checkpoint_every=2, log_every=1, pause_at=pause_at, eval_every=every
    )
    init_state, batches, step = _toy(seen, **toy)

    def evaluate(state):
        evaluated.append(int(state["step"]))
        return {"retrieval/RR": 0.5}

    with loop.run_directory(str(model_dir), None, schedule, "# toy\n") as directory:
        metrics = loop.run(
            directory, schedule, init_state=init_state, batches=batches, step=step, evaluate=evaluate if every else None
        )
    return metrics, seen


def _saved(model_dir):
    return sorted(int(p.name) for p in (model_dir / "checkpoints").iterdir() if p.name.isdigit())


def _w(model_dir, step):
    from samtone_jax.checkpoints.train_checkpoints import restore_on_one_device

    return np.asarray(restore_on_one_device(model_dir / "checkpoints" / str(step) / "state")["params"]["w"])


def test_sigterm_stops_at_the_step_boundary_and_the_rerun_ends_where_the_straight_run_does(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "check_existing_run", lambda *a, **k: None)  # the toy has no model to compare
    _run(tmp_path / "straight")
    stopped, seen = _run(tmp_path / "stopped", sigterm_at=3)
    assert _saved(tmp_path / "stopped") == [2, 3] and seen == [0]  # step 3 saved at the boundary, off-interval
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are put back
    _, seen = _run(tmp_path / "stopped")
    assert seen == [3]  # the batch source restarted at the resumed step
    np.testing.assert_array_equal(_w(tmp_path / "stopped", 6), _w(tmp_path / "straight", 6))
    assert (tmp_path / "stopped" / "config.gin").read_text() == "# toy\n"
    assert (tmp_path / "stopped" / "operative_config.gin").exists()


def test_a_pause_saves_and_stops_there_and_the_rerun_ends_where_the_straight_run_does(tmp_path, monkeypatch):
    """schedule.pause_at: stopped at that step with its state saved (finetune mines again there); the
    rerun without it goes on with the whole run's schedule to the uninterrupted parameters."""
    monkeypatch.setattr(loop, "check_existing_run", lambda *a, **k: None)
    _run(tmp_path / "straight")
    evaluated = []
    _, seen = _run(tmp_path / "paused", pause_at=3, evaluated=evaluated)
    assert _saved(tmp_path / "paused") == [2, 3] and seen == [0] and evaluated == [3]  # the pause step's eval ran
    _, seen = _run(tmp_path / "paused", pause_at=3, evaluated=evaluated)  # the same command: on to the end
    assert seen == [3] and _saved(tmp_path / "paused")[-1] == 6 and evaluated == [3, 6]  # step 3 not again
    np.testing.assert_array_equal(_w(tmp_path / "paused", 6), _w(tmp_path / "straight", 6))


def test_a_non_finite_loss_or_gradient_norm_stops_naming_the_last_good_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "check_existing_run", lambda *a, **k: None)
    with pytest.raises(NonFiniteLossError, match=r"nan at step 5 .*last good checkpoint: step 4"):
        _run(tmp_path / "run", nan_at=5)
    assert _saved(tmp_path / "run") == [2, 4]
    assert not (tmp_path / "run" / "operative_config.gin").exists()  # written by finished runs only
    assert not (tmp_path / "run" / "lock.json").exists()  # released on the way out
    # A finite loss with an infinite gradient norm (the update clipped to nothing) stops alike.
    with pytest.raises(NonFiniteLossError, match=r"grad_norm is inf at step 3 .*last good checkpoint: step 2"):
        _run(tmp_path / "overflow", inf_grad_at=3)


def test_a_second_run_in_a_held_model_dir_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "check_existing_run", lambda *a, **k: None)
    schedule = loop.Schedule(train_steps=2, global_batch=1)
    with loop.run_directory(str(tmp_path), None, schedule, "# first\n"):
        with pytest.raises(RunLockedError, match="is in use by another run"):
            with loop.run_directory(str(tmp_path), None, schedule, "# second\n"):
                pass
    assert (tmp_path / "config.gin").read_text() == "# first\n"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("on_corrupt_checkpoint", "retry", "train_adore.on_corrupt_checkpoint = 'retry': use 'fallback' or 'fail'"),
        ("log_every", 0, "train_adore.log_every = 0: must be ≥ 1"),
        ("eval_every", -1, "train_adore.eval_every = -1"),
        ("pause_at", 2, "train_adore.pause_at = 2: must be a step before train_adore.train_steps = 2"),
    ],
)
def test_a_bad_schedule_names_the_gin_setting(field, value, message):
    with pytest.raises(BadValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        loop.Schedule(train_steps=2, global_batch=1, gin_name="train_adore", **{field: value})


# Both real modes (and train with packed batches) through loop.run: SIGTERM after step 2
# checkpoints and exits 0; the rerun resumes there and ends with the parameters of the
# uninterrupted run, bit for bit.


def _mode_argv(mode, model_dir, init, vocab_path, steps, bert=None):
    from conftest import tiny_bert_train_argv, tiny_train_argv

    if mode == "train-bert-packed":  # a BERT tower from an import: its dropout 0.1, packed rows
        return tiny_bert_train_argv(model_dir, bert, steps=steps, extra=["--gin.schedule.checkpoint_every=100"])
    if mode.startswith("train-packed") or mode == "train":
        extra = ["--gin.schedule.checkpoint_every=100", "--gin.DROPOUT_RATE=0.1"]
        if mode == "train-packed":
            extra += ["--gin.packing.enabled=True", "--gin.packing.max_segments=4"]
        return tiny_train_argv(model_dir, vocab_path, steps=steps, extra=extra)
    return [
        "train-adore",
        "--gin_file=runs/adore.gin",
        f"--gin.INIT='{init}'",
        "--gin.TASK='wordnet_definitions'",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.TRAIN_STEPS={steps}",
        "--gin.BATCH_SIZE=8",
        "--gin.train_adore.split='all'",
        "--gin.train_adore.k=5",
        "--gin.LEARNING_RATE=0.05",
        "--gin.train_adore.log_every=1",
        "--gin.train_adore.checkpoint_every=100",
        "--gin.create_mesh.num_devices=1",  # as tiny_train_argv
    ]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "train-packed", "train-bert-packed", "train-adore"])
def test_both_modes_stop_on_sigterm_and_resume_to_the_uninterrupted_parameters(
    mode, trained_run, wordnet_env, tmp_path, monkeypatch, caplog, request
):
    from samtone_jax.cli import gin_registry
    from samtone_jax.cli import main as cli

    vocab_path = wordnet_env[1]
    bert = request.getfixturevalue("tiny_bert_import") if mode == "train-bert-packed" else None
    argv = functools.partial(_mode_argv, mode, init=trained_run, vocab_path=vocab_path, steps=4, bert=bert)
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert cli.main(argv(straight)) == 0

    record = ProgressLogger.record

    def record_then_preempt(self, step, metrics):
        record(self, step, metrics)
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(ProgressLogger, "record", record_then_preempt)
    assert cli.main(argv(stopped)) == 0
    assert "preempted: saved step 2" in caplog.text
    assert _saved(stopped) == [2]
    monkeypatch.setattr(ProgressLogger, "record", record)
    assert cli.main(argv(stopped)) == 0
    assert _saved(stopped) == [2, 4]
    a = _params(straight, 4)
    b = _params(stopped, 4)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    kept = "tokenizer.json" if bert else "vocab.model"
    assert {"config.gin", "operative_config.gin", kept} <= {p.name for p in paths.as_path(stopped).iterdir()}
    gin_registry.parse([], [])


def _params(model_dir, step):
    from samtone_jax.checkpoints.train_checkpoints import restore_on_one_device

    return restore_on_one_device(model_dir / "checkpoints" / str(step) / "state")["params"]


def test_sigterm_during_a_slow_eval_saves_within_a_batch_not_after_the_eval(tmp_path, monkeypatch, capsys):
    """The in-training eval polls stop_request between its encoding batches (text_embedder): a
    SIGTERM that lands in a 50-batch eval ends it after the batch in flight, and the step it was
    evaluating is saved (a preempted TPU VM has ~30 s; the eval may take minutes)."""
    import time

    from samtone_jax.core import stop_request

    monkeypatch.setattr(loop, "check_existing_run", lambda *a, **k: None)
    batches_done = []

    def slow_eval(state):
        for batch in range(50):
            if batch == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            batches_done.append(batch)
            stop_request.check()
        return {"retrieval/RR": 1.0}

    schedule = loop.Schedule(train_steps=8, global_batch=1, checkpoint_every=4, log_every=1, eval_every=3)
    init_state, batches, step = _toy([])
    start = time.time()
    with loop.run_directory(str(tmp_path), None, schedule, "# toy\n") as directory:
        loop.run(directory, schedule, init_state=init_state, batches=batches, step=step, evaluate=slow_eval)
    assert batches_done == [0, 1, 2] and time.time() - start < 20
    assert _saved(tmp_path) == [3]  # the evaluated step, off the checkpoint interval; no step 4
    assert not stop_request.requested()  # cleared with the handlers
    assert "eval step" not in capsys.readouterr().out  # the abandoned eval logs nothing


def test_a_stop_during_the_eval_never_saves_a_state_whose_loss_was_not_checked(tmp_path, monkeypatch):
    """log_every=3 keeps losses on device; a NaN at step 3 then a SIGTERM in step 3's eval must
    not save step 3 as if it were good."""
    from samtone_jax.core import stop_request
    from samtone_jax.training.train_logging import NonFiniteLossError

    monkeypatch.setattr(loop, "check_existing_run", lambda *a, **k: None)

    def eval_then_sigterm(state):
        os.kill(os.getpid(), signal.SIGTERM)
        stop_request.check()
        return {}

    schedule = loop.Schedule(train_steps=6, global_batch=1, checkpoint_every=2, log_every=3, eval_every=3)
    init_state, batches, step = _toy([], nan_at=3)
    with pytest.raises(NonFiniteLossError, match="step 2"):
        with loop.run_directory(str(tmp_path), None, schedule, "# toy\n") as directory:
            loop.run(directory, schedule, init_state=init_state, batches=batches, step=step, evaluate=eval_then_sigterm)
    assert _saved(tmp_path) == [2]
