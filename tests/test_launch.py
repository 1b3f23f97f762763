"""The Cloud TPU scripts print exactly the gcloud commands they would run (--dry-run), and refuse
bad input; launch/local.sh itself is exercised by tests/test_train_loop.py (2 processes × 2 devices)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

TPU = Path(__file__).resolve().parent.parent / "launch" / "tpu"
COMMON = ["--name=samtone", "--zone=us-central2-b", "--dry-run"]


def dry_run(script, *args):
    out = subprocess.run(["bash", str(TPU / script), *COMMON, *args], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_create_prints_the_tpu_vm_or_queued_resource_command():
    assert dry_run("create.sh", "--accelerator=v5p-128", "--project=my-proj") == [
        "gcloud compute tpus tpu-vm create samtone --zone=us-central2-b --project=my-proj "
        "--accelerator-type=v5p-128 --version=tpu-ubuntu2204-base "
    ]
    queued = dry_run("create.sh", "--queued", "--spot")
    assert queued[0] == (
        "gcloud compute tpus queued-resources create samtone --node-id=samtone --zone=us-central2-b "
        "--accelerator-type=v4-32 --runtime-version=tpu-ubuntu2204-base --spot "
    )
    assert queued[1].startswith("gcloud compute tpus queued-resources describe samtone")


def test_setup_packs_the_working_tree_and_runs_the_worker_setup_on_every_worker():
    lines = dry_run("setup.sh")
    assert lines[0].startswith("bash ") and lines[0].rstrip().endswith("launch/tpu/pack.sh /tmp/samtone_jax.tar.gz")
    assert lines[1].startswith("gcloud compute tpus tpu-vm scp /tmp/samtone_jax.tar.gz samtone:\\~/")
    assert "--worker=all" in lines[1] and "--worker=all" in lines[2]
    command = argv_of(lines[2])[-1].removeprefix("--command=")
    # the old checkout is replaced, the logs folder is not; the worker script's output is appended
    assert "rm -rf samtone_jax &&" in command and "rm -rf samtone_logs" not in command
    assert "bash samtone_jax/launch/tpu/worker_setup.sh 2>&1 | tee -a samtone_logs/setup.log" in command


def argv_of(line: str) -> list[str]:
    """The words of a printed (printf %q) command line, as bash reads them."""
    script = 'eval "words=($1)"; printf "%s\\0" "${words[@]}"'
    out = subprocess.run(["bash", "-c", script, "_", line], capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_pack_carries_uncommitted_edits_and_new_files_but_not_ignored_or_deleted_ones(tmp_path):
    repo = tmp_path / "repo"
    (repo / "gin").mkdir(parents=True)
    (repo / ".gitignore").write_text(".venv/\n")
    for name in ("kept.txt", "edited.txt", "deleted.txt"):
        (repo / name).write_text("committed\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    (repo / "edited.txt").write_text("edited\n")
    (repo / "deleted.txt").unlink()
    (repo / "gin" / "new run.gin").write_text("TRAIN_STEPS = 5\n")
    (repo / ".venv").mkdir()
    (repo / ".venv" / "big").write_text("ignored\n")
    out = subprocess.run(
        ["bash", str(TPU / "pack.sh"), str(tmp_path / "t.tgz"), f"--repo={repo}"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "carrying uncommitted changes" in out.stdout and "gin/new run.gin" in out.stdout
    with tarfile.open(tmp_path / "t.tgz") as tar:
        names = sorted(tar.getnames())
        assert names == [
            "samtone_jax/.gitignore",
            "samtone_jax/edited.txt",
            "samtone_jax/gin/new run.gin",
            "samtone_jax/kept.txt",
        ]
        assert tar.extractfile("samtone_jax/edited.txt").read() == b"edited\n"
    bad = subprocess.run(["bash", str(TPU / "pack.sh"), "x.tgz", f"--repo={tmp_path}"], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a git checkout" in bad.stderr


def fake_python(folder: Path, name: str, version: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(f"#!/bin/sh\necho {version}\n")
    (folder / name).chmod(0o755)


def worker_setup(tmp_path, *args, path):
    """worker_setup.sh --dry-run with only `path` on PATH (the fake pythons and the tools it uses)."""
    for tool in ("sed", "sha256sum", "cut", "cat", "dirname"):
        if not (path / tool).exists():
            (path / tool).symlink_to(shutil.which(tool))
    env = dict(os.environ, HOME=str(tmp_path), PATH=str(path))
    return subprocess.run(
        [shutil.which("bash"), str(TPU / "worker_setup.sh"), "--dry-run", *args],
        capture_output=True,
        text=True,
        env=env,
    )


def test_worker_setup_installs_python_3_11_when_the_image_lacks_it(tmp_path):
    """tpu-ubuntu2204-base has Python 3.10 only: python3.11 comes from deadsnakes, then the lock."""
    fake_python(tmp_path / "bin", "python3", "3.10")  # the image's python; no python3.11 on PATH
    out = worker_setup(tmp_path, path=tmp_path / "bin")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any("add-apt-repository -y ppa:deadsnakes/ppa" in x for x in lines)
    assert any(x.startswith("sudo") and "install -y -qq python3.11 python3.11-venv" in x for x in lines)
    venv = f"{tmp_path}/samtone_venv"
    assert f"python3.11 -m venv {venv} " in lines
    lock = [x for x in lines if " -r " in x]
    assert lock and lock[0].startswith(f"{venv}/bin/pip install -q -r ") and "requirements.lock" in lock[0]
    assert "download.pytorch.org/whl/cpu" in lock[0]  # the lock pins torch's +cpu wheel
    tpu = [x for x in lines if "jax\\[tpu\\]" in x]
    assert tpu and "jax\\[tpu\\]==0.10.2" in tpu[0] and lines.index(tpu[0]) > lines.index(lock[0])


def test_worker_setup_refuses_a_python_that_is_not_3_11_and_keeps_a_venv_matching_the_lock(tmp_path):
    fake_python(tmp_path / "bin", "python3.10", "3.10")
    out = worker_setup(tmp_path, "--python=python3.10", path=tmp_path / "bin")
    assert out.returncode == 2 and "is Python 3.10" in out.stderr and "--python=python3.11" in out.stderr
    missing = worker_setup(tmp_path, "--python=python3.12", path=tmp_path / "bin")
    assert missing.returncode == 2 and "python3.12 is not on PATH" in missing.stderr
    fake_python(tmp_path / "bin", "python3.11", "3.11")
    lock = TPU.parent.parent / "requirements.lock"
    (tmp_path / "samtone_venv").mkdir()
    stamp = tmp_path / "samtone_venv" / ".lock.sha256"
    stamp.write_text(hashlib.sha256(lock.read_bytes()).hexdigest() + "\n")
    kept = worker_setup(tmp_path, path=tmp_path / "bin")
    assert kept.returncode == 0 and "matches requirements.lock: kept" in kept.stdout
    assert " -r " not in kept.stdout and "-m venv" not in kept.stdout and "-e " in kept.stdout
    stamp.write_text("an older lock\n")
    rebuilt = worker_setup(tmp_path, path=tmp_path / "bin")
    assert rebuilt.returncode == 0 and " -r " in rebuilt.stdout and f"rm -rf {tmp_path}/samtone_venv" in rebuilt.stdout


def test_train_runs_the_same_command_on_every_worker_and_logs_reads_host_0():
    lines = dry_run("train.sh", "--", "--gin_file=runs/finetune_multireqa.gin", "--gin.MODEL_DIR='gs://b/run'")
    assert lines[0].startswith("gcloud compute tpus tpu-vm ssh samtone --zone=us-central2-b --worker=all --command=")
    assert "samtone\\ train\\ --multihost\\ --gin_file=runs/finetune_multireqa.gin" in lines[0]
    assert "gs://b/run" in lines[0]
    assert dry_run("logs.sh")[0].startswith("gcloud compute tpus tpu-vm ssh samtone --zone=us-central2-b --worker=0")
    assert "samtone_logs/eval.log" in dry_run("logs.sh", "--log=eval")[0]


@pytest.mark.parametrize(("mode", "worker", "multihost"), [("eval", "all", True), ("export", "0", False)])
def test_run_appends_each_run_to_the_mode_log_with_the_exact_arguments(tmp_path, mode, worker, multihost):
    """The remote command, run here in a fake worker home: a second run appends to the first's log."""
    args = ["--gin.evaluate.model_dir='gs://b/run a'", '--gin.X="two words"']
    line = dry_run("run.sh", mode, "--", *args)[0]
    words = argv_of(line)
    assert f"--worker={worker}" in words
    command = words[-1].removeprefix("--command=")
    (tmp_path / "samtone_jax").mkdir()
    (tmp_path / "samtone_venv" / "bin").mkdir(parents=True)
    samtone = tmp_path / "samtone_venv" / "bin" / "samtone"
    samtone.write_text('#!/bin/sh\nfor a in "$@"; do echo "arg=$a"; done\n')
    samtone.chmod(0o755)
    for _ in range(2):
        subprocess.run(["bash", "-c", command + " wait"], cwd=tmp_path, check=True)
    log = (tmp_path / "samtone_logs" / f"{mode}.log").read_text().splitlines()
    expected = [f"arg={mode}", *(["arg=--multihost"] if multihost else []), *(f"arg={a}" for a in args)]
    assert [x for x in log if x.startswith("arg=")] == expected * 2
    assert sum(x.startswith("=== ") for x in log) == 2
    bad = subprocess.run(["bash", str(TPU / "run.sh"), *COMMON, "--", "--gin.X=1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "name the samtone mode" in bad.stderr


def test_delete_and_missing_flags():
    assert dry_run("delete.sh") == ["gcloud compute tpus tpu-vm delete samtone --zone=us-central2-b --quiet "]
    assert dry_run("delete.sh", "--queued")[0].startswith("gcloud compute tpus queued-resources delete samtone")
    bad = subprocess.run(["bash", str(TPU / "create.sh"), "--zone=z"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--name=NAME and --zone=ZONE are required" in bad.stderr


@pytest.mark.parametrize("argv", [[], ["two", "train"]])
def test_local_launcher_usage(argv):
    out = subprocess.run(["bash", str(TPU.parent / "local.sh"), *argv], capture_output=True, text=True)
    assert out.returncode == 2 and "usage:" in out.stderr


def test_average_joins_the_pod_on_every_worker_and_runs_alone_on_one():
    """A uniform soup runs on every worker with --multihost (each host its shards); a greedy one, on
    worker 0 alone, must not join a runtime whose other hosts never come."""
    every = dry_run("run.sh", "average", "--", "--checkpoint", "gs://b/a", "gs://b/b", "--out=gs://b/soup")[0]
    one = dry_run("run.sh", "--worker=0", "average", "--", "--checkpoint", "gs://b/a", "--task=t", "--out=gs://b/g")[0]
    assert "--worker=all" in argv_of(every) and "average\\ --multihost" in every
    assert "--worker=0" in argv_of(one) and "multihost" not in one
