"""The training loop as users run it (`samtone train` in subprocesses): resume after SIGKILL,
SIGKILL and Ctrl-C across processes, 2 processes x 2 devices == 1 x 4, gin errors, and learning on
real data. (SIGTERM in one process, for both training modes: tests/test_loop.py.)"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TEST_XLA_FLAGS

from samtone_jax.checkpoints.train_checkpoints import restore_on_one_device
from samtone_jax.cli import gin_registry
from samtone_jax.core import paths

# The step (and each encoding batch of the in-training eval) slowed down from outside, so a signal
# can land mid-run or mid-eval (test instrumentation only).
SLOW = (
    "import sys, time; import samtone_jax.training.train_logging as t; record = t.ProgressLogger.record; "
    "t.ProgressLogger.record = lambda self, s, m: (time.sleep(0.7), record(self, s, m))[1]; "
    "import samtone_jax.inference.text_embedder as e; encode = e.TextEmbedder.encode_tokens; "
    "e.TextEmbedder.encode_tokens = lambda self, *a, **k: (time.sleep(1.0), encode(self, *a, **k))[1]; "
    "from samtone_jax.cli import main as cli; sys.exit(cli.main(sys.argv[1:]))"
)


def _argv(model_dir, vocab_path, steps=6, extra=()):
    return [
        "train",
        "--gin_file=models/t5_1_1_tiny.gin",
        "--gin_file=architectures/sde.gin",
        "--gin_file=losses/samtone_query.gin",
        "--gin.VOCAB_SIZE=100",
        "--gin.DROPOUT_RATE=0.1",
        "--gin.TEMPERATURE=0.05",
        f"--gin.train.model_dir='{model_dir}'",
        "--gin.train.task='wordnet_definitions'",
        "--gin.inputs.split='all'",
        f"--gin.train.train_steps={steps}",
        "--gin.train.batch_size=4",
        "--gin.train.query_length=8",
        "--gin.train.doc_length=12",
        f"--gin.train.vocabulary='{vocab_path}'",
        "--gin.schedule.checkpoint_every=3",
        "--gin.schedule.log_every=1",
        *extra,
    ]


def _env(wordnet_dir, cpu_devices=None):
    env = dict(os.environ, WORDNET_DIR=str(wordnet_dir), TF_CPP_MIN_LOG_LEVEL="3")
    env["XLA_FLAGS"] = TEST_XLA_FLAGS  # each process sets its own device count (--num_cpu_devices)
    return env


def _launch(argv, env, log_path, slow=False):
    code = ["-c", SLOW] if slow else ["-m", "samtone_jax.cli.main"]
    return subprocess.Popen(
        [sys.executable, *code, *argv], env=env, stdout=open(log_path, "w"), stderr=subprocess.STDOUT
    )


def _in_process(argv, capsys, devices):
    """`samtone ARGV` in this process on its first `devices` devices (create_mesh.num_devices); its stdout."""
    from samtone_jax.cli import main as cli

    capsys.readouterr()
    assert cli.main([*argv, f"--gin.create_mesh.num_devices={devices}"]) == 0
    return capsys.readouterr().out


def _losses(text):
    return {int(s): float(v) for s, v in re.findall(r"^step (\d+)/\d+ \| loss ([0-9.]+)", text, re.M)}


def _params(model_dir, step):
    return restore_on_one_device(f"{model_dir}/checkpoints/{step}/state")["params"]


def _wait_for(predicate, timeout=240):
    start = time.time()
    while not predicate():
        if time.time() - start > timeout:
            raise TimeoutError("condition not reached")
        time.sleep(0.1)


@pytest.mark.slow
def test_resume_after_sigkill_gives_identical_losses_and_parameters(wordnet_env, tmp_path, gcs, capsys):
    """A run on local disk and the same run on gs:// (the emulator), SIGKILLed after checkpoint 3
    and rerun: identical losses and bit-identical parameters; everything it wrote is in the bucket.
    The killed run is a `samtone train` process of one device; the straight run and the rerun are
    `samtone train` in this process on its first device (create_mesh.num_devices)."""
    wn, vocab_path = wordnet_env
    env = _env(wn)

    def here(argv):
        return _in_process(argv, capsys, devices=1)

    straight = _losses(here(_argv(tmp_path / "straight", vocab_path)))
    assert sorted(straight) == [1, 2, 3, 4, 5, 6]

    killed_dir = f"{gcs.bucket()}/killed"
    proc = _launch(_argv(killed_dir, vocab_path), env, tmp_path / "killed.log", slow=True)
    _wait_for(lambda: paths.as_path(f"{killed_dir}/checkpoints/3/commit_success.txt").exists())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    first = _losses(open(tmp_path / "killed.log").read())
    assert 3 in first and 6 not in first
    resumed_text = here(_argv(killed_dir, vocab_path))
    resumed = _losses(resumed_text)
    assert min(resumed) == 4, resumed_text[-2000:]  # it continued after checkpoint 3
    losses = {**{s: v for s, v in first.items() if s <= 3}, **resumed}
    np.testing.assert_allclose([losses[s] for s in range(1, 7)], [straight[s] for s in range(1, 7)], rtol=1e-6)
    a, b = _params(tmp_path / "straight", 6), _params(killed_dir, 6)
    for x, y in zip(jax_leaves(a), jax_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    written = {p.name for p in paths.as_path(killed_dir).iterdir()}
    assert {"config.gin", "operative_config.gin", "vocab.model", "checkpoints", "train"} <= written
    assert paths.as_path(f"{killed_dir}/vocab.model").read_bytes() == vocab_path.read_bytes()
    # TensorBoard reads the events the resumed run wrote to the bucket (copied back here).
    events = tmp_path / "events"
    events.mkdir()
    latest = sorted(paths.as_path(f"{killed_dir}/train").glob("events.out.tfevents.*"))[-1]
    (events / latest.name).write_bytes(latest.read_bytes())
    logged = _series(events, "loss")
    np.testing.assert_allclose(logged, [resumed[s] for s in sorted(resumed)], rtol=1e-4)


def jax_leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REPO = Path(__file__).resolve().parent.parent


def _local(n, devices, argv, env, log_dir, timeout=300):
    """launch/local.sh: n processes of `devices` CPU devices each over jax.distributed."""
    cmd = [
        "bash",
        str(REPO / "launch" / "local.sh"),
        str(n),
        f"--devices={devices}",
        f"--port={_free_port()}",
        f"--logs={log_dir}",
        *argv,
    ]
    proc = subprocess.run(cmd, env=dict(env, PYTHON=sys.executable), capture_output=True, text=True, timeout=timeout)
    logs = "".join(open(os.path.join(log_dir, f)).read()[-2000:] for f in sorted(os.listdir(log_dir)))
    assert proc.returncode == 0, proc.stderr + logs
    return open(os.path.join(log_dir, "process_0.log")).read()


@pytest.mark.slow
def test_two_processes_of_two_devices_equal_one_of_four_and_checkpoints_cross_topologies(
    wordnet_env, tmp_path, gcs, capsys
):
    """launch/local.sh 2 × 2 devices = 1 × 4 (train and eval); a checkpoint saved on 2 processes × 2
    devices resumes on 1 device, one saved on 1 × 4 resumes on 2 × 2, and both reach the same state.
    The two-process runs use a gs:// MODEL_DIR (the emulator), as on a pod: shared by the hosts. The
    one-process runs are `samtone` in this process on its first 4 (or 1) devices
    (create_mesh.num_devices): three interpreter starts fewer, the same programs."""
    import json

    wn, vocab_path = wordnet_env
    env = _env(wn)

    def here(argv, devices):
        return _in_process(argv, capsys, devices)

    single, multi = tmp_path / "single", f"{gcs.bucket()}/multi"
    shards = ["--gin.inputs.data_shards=2"]  # the same global batches on 1 or 2 hosts (each reads its shard)
    here(_argv(single, vocab_path, steps=3, extra=shards), devices=4)
    text = _local(2, 2, _argv(multi, vocab_path, steps=3, extra=shards), env, tmp_path / "logs_multi")
    for x, y in zip(jax_leaves(_params(single, 3)), jax_leaves(_params(multi, 3)), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert sorted(_losses(text)) == [1, 2, 3]
    # Cross-topology resumption: 2 × 2 -> 1 × 1 and 1 × 4 -> 2 × 2, both on to step 5.
    one = here(_argv(multi, vocab_path, steps=5, extra=shards), devices=1)
    two = _local(2, 2, _argv(single, vocab_path, steps=5, extra=shards), env, tmp_path / "logs_single")
    assert sorted(_losses(one)) == sorted(_losses(two)) == [4, 5]
    for a, b in zip(_losses(one).values(), _losses(two).values(), strict=True):
        assert a == pytest.approx(b, rel=1e-5)
    for x, y in zip(jax_leaves(_params(single, 5)), jax_leaves(_params(multi, 5)), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    # Evaluation on 2 processes (each encodes its share) = on 1 process.
    flags = ["--gin.evaluate.task='wordnet_definitions'", "--gin.evaluate.split='all'", "--gin.evaluate.k=10"]
    here(["eval", f"--gin.evaluate.model_dir='{single}'", *flags], devices=4)
    _local(2, 2, ["eval", f"--gin.evaluate.model_dir='{multi}'", *flags], env, tmp_path / "logs_eval")
    results = [
        json.loads(paths.as_path(f"{d}/eval/wordnet_definitions_all_step5.json").read_text())["metrics"]
        for d in (single, multi)
    ]
    assert results[0] == pytest.approx(results[1], abs=1e-6)
    # A soup on 2 processes × 2 devices, into the bucket: each process restores and sums only its
    # shards of each ingredient and writes them; the soup is the mean of the two (numpy, here).
    soup = f"{gcs.bucket()}/soup"
    steps = [f"{single}/checkpoints/3", f"{multi}/checkpoints/5"]
    _local(2, 2, ["average", "--checkpoint", *steps, f"--out={soup}"], env, tmp_path / "logs_soup")
    from samtone_jax.checkpoints import load_params

    mean = [(x + y) / 2 for x, y in zip(jax_leaves(_params(single, 3)), jax_leaves(_params(multi, 5)), strict=True)]
    for x, y in zip(jax_leaves(load_params(soup)), mean, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_a_packed_lora_bert_run_on_two_processes_equals_one_process_of_two_devices(
    wordnet_env, tiny_bert_import, tmp_path, capsys
):
    """A BERT tower from an import (dropout 0.1), packed rows, with LoRA adapters (ade_lora: the frozen
    tower read from the import by every process, the checkpoints without it): each process packs its
    own pairs, the hosts agree on the row counts (the floor from the first batches included), and the
    trained parameters are those of one process holding both devices."""
    from conftest import tiny_bert_train_argv

    single, multi = tmp_path / "single", tmp_path / "multi"
    shards = [
        "--gin.inputs.data_shards=2",
        "--gin.DualEncoder.architecture='ade_lora'",
        "--gin.DualEncoder.lora_rank=4",
    ]

    def argv(model_dir):
        return tiny_bert_train_argv(model_dir, tiny_bert_import, steps=3, extra=shards, devices=None)

    _in_process(argv(single), capsys, devices=2)
    text = _local(2, 1, argv(multi), _env(wordnet_env[0]), tmp_path / "logs")
    assert sorted(_losses(text)) == [1, 2, 3]
    assert set(_params(multi, 3)) == {"query_adapter", "document_adapter", "projection"}
    assert (multi / "base.json").read_text() == (single / "base.json").read_text()
    for x, y in zip(jax_leaves(_params(single, 3)), jax_leaves(_params(multi, 3)), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_killed_process_then_ctrl_c_mid_eval_on_two_processes_and_the_rerun_resumes(wordnet_data, tmp_path):
    """Two faults of a 2-process run, the second in the rerun after the first:

    1. One process SIGKILLed mid-run (after the periodic checkpoint of step 2): the other exits with
       the runtime's error within the heartbeat timeout (no hang).
    2. The rerun of both processes resumes from the last periodic checkpoint; Ctrl-C (SIGINT) that
       reaches one host only, while both are inside a slow in-training retrieval eval, takes the
       preemption route (a SIGTERM of that process, which JAX's preemption service tells the other):
       both leave the eval at the same encoding batch, checkpoint the evaluated step together and
       exit 0 (before: the stop waited for the end of the eval and one more step), and that
       checkpoint is complete (restored here). A rerun resuming from a preemption checkpoint is
       tested in one process (tests/test_loop.py), not here."""
    wn, vocab_path = wordnet_data
    env, model_dir = _env(wn), tmp_path / "run"
    no_dropout = ["--gin.DROPOUT_RATE=0.0"]  # no values are compared here: a step half as long to compile
    every = 4  # the retrieval eval: 46 encoding batches (91 texts, 2 a batch) of > 1 s each (SLOW)
    evaluation = [
        f"--gin.schedule.eval_every={every}",
        "--gin.train_eval.retrieval_task='wordnet_definitions'",
        "--gin.train_eval.retrieval_split='all'",
        "--gin.RetrievalEval.batch_size=1",
    ]

    def launch_two(name):
        extra = [*no_dropout, "--gin.schedule.checkpoint_every=2", *evaluation]
        argv = _argv(model_dir, vocab_path, steps=40, extra=extra)
        flags = [
            f"--coordinator_address=127.0.0.1:{_free_port()}",
            "--num_processes=2",
            "--num_cpu_devices=1",
            "--heartbeat_timeout_seconds=10",
        ]
        logs = [tmp_path / f"{name}{i}.log" for i in range(2)]
        procs = [_launch([*argv, *flags, f"--process_id={i}"], env, logs[i], slow=True) for i in range(2)]
        return procs, logs

    procs, logs = launch_two("killed")
    checkpoint_2 = model_dir / "checkpoints" / "2"  # orbax renames its temporary folder when complete
    try:
        _wait_for(lambda: (checkpoint_2.is_dir() and "step 3/" in logs[0].read_text()) or procs[0].poll() is not None)
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=30)
        start = time.time()
        survivor = procs[0].wait(timeout=120)  # a hang fails here
    finally:
        for p in procs:
            p.kill()
    assert survivor != 0 and time.time() - start < 60, logs[0].read_text()[-2000:]
    assert "heartbeat" in logs[0].read_text()  # "stopped sending heartbeats" / "heartbeat timeout"

    procs, logs = launch_two("interrupted")
    resumed_from = re.compile(r"resumed from step (\d+)")
    try:
        _wait_for(lambda: resumed_from.search(logs[0].read_text()) or procs[0].poll() is not None)
        found = resumed_from.search(logs[0].read_text())
        assert found, logs[0].read_text()[-2000:]
        resumed = int(found.group(1))
        assert resumed >= 2 and resumed % 2 == 0  # a periodic checkpoint of the killed run
        evaluated = (resumed // every + 1) * every
        _wait_for(lambda: all(f"evaluating step {evaluated}" in log.read_text() for log in logs))
        time.sleep(2)  # some batches into the eval
        signalled = time.time()
        procs[1].send_signal(signal.SIGINT)
        codes = [p.wait(timeout=120) for p in procs]  # a host left in a collective fails here
        stopped_in = time.time() - signalled
    finally:
        for p in procs:
            p.kill()
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], [text[-2000:] for text in texts]
    for text in texts:  # both left the eval and saved the step it evaluated; no step after it ran
        assert f"stopped during the eval at step {evaluated}: saved it" in text, text[-2000:]
        assert "preempted: saved step" not in text and f"step {evaluated + 1}/" not in text
    assert stopped_in < 25, stopped_in  # the eval alone takes > 46 s
    assert int(restore_on_one_device(model_dir / "checkpoints" / str(evaluated) / "state")["step"]) == evaluated
    assert sorted(_losses(texts[0])) == list(range(resumed + 1, evaluated + 1))


def test_missing_macro_and_gin_typo_fail_before_compilation(capsys):
    from samtone_jax.cli import main as cli

    assert cli.main(["train", "--gin_file=models/t5_1_1_tiny.gin", "--gin_file=runs/finetune_multireqa.gin"]) == 2
    assert "MODEL_DIR" in capsys.readouterr().err
    assert cli.main(["train", "--gin_file=runs/demo_cpu.gin", "--gin.train.batchsize=3"]) == 2
    assert "train.batchsize" in capsys.readouterr().err


@pytest.mark.slow
def test_loss_falls_and_accuracy_rises_on_real_squad(tmp_path, squad_dev):
    """Also: the in-training retrieval evaluation equals `samtone eval` of the saved checkpoint."""
    import json

    from samtone_jax.evaluation import run as eval_run

    vocab_path = squad_dev
    gin_registry.parse(
        ["models/t5_1_1_tiny.gin", "architectures/sde.gin", "losses/samtone_query.gin"],
        [
            "VOCAB_SIZE = 2000",
            "TEMPERATURE = 0.05",
            f"train.model_dir = '{tmp_path / 'run'}'",
            "train.task = 'multireqa_squad_dev'",
            "train.train_steps = 120",
            "train.batch_size = 32",
            "train.query_length = 24",
            "train.doc_length = 48",
            f"train.vocabulary = '{vocab_path}'",
            "schedule.log_every = 20",
            "schedule.checkpoint_every = 1000",
            "adafactor.learning_rate = 1e-2",
            "schedule.eval_every = 60",
            "train_eval.split = 'test'",
            "train_eval.retrieval_task = 'multireqa_squad_dev'",
            "train_eval.retrieval_split = 'test'",
            "create_mesh.num_devices = 1",  # a tiny model learns no differently, and faster, on one
        ],
    )
    gin_registry.train_program()
    hook = _series(tmp_path / "run" / "eval", "eval/retrieval/RR")
    assert len(hook) == 2  # steps 60 and 120
    gin_registry.parse([], [f"evaluate.model_dir = '{tmp_path / 'run'}'", "evaluate.task = 'multireqa_squad_dev'"])
    offline = eval_run.evaluate()
    assert json.load(open(tmp_path / "run" / "eval" / "multireqa_squad_dev_test_step120.json"))["queries"] == 2000
    assert hook[-1] == pytest.approx(offline["RR"], abs=1e-4)
    assert offline["RR"] > 10 * sum(1 / r for r in range(1, 10643)) / 10642  # far above a random ranking
    lines = _losses_and_acc((tmp_path / "run").as_posix())
    (first_loss, first_acc), (last_loss, last_acc) = lines[0], lines[-1]
    # Measured here (one device): loss 3.57 -> 2.85, in-batch accuracy 0.20 -> 0.31 (batch 32: chance 0.03).
    assert last_loss < first_loss - 0.4 and last_acc > first_acc + 0.08, lines


def _series(directory, tag):
    """The values of one TensorBoard scalar in `directory`, in step order."""
    import tensorflow as tf
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)]


def _losses_and_acc(model_dir):
    """(loss, accuracy) per logged step, read back from the TensorBoard events."""
    train_dir = os.path.join(model_dir, "train")
    return list(zip(_series(train_dir, "loss"), _series(train_dir, "accuracy"), strict=True))
