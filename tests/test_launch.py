"""The Cloud TPU scripts print exactly the gcloud commands they would run (--dry-run), and refuse
bad input; launch/local.sh itself is exercised by tests/test_train_loop.py (2 processes × 2 devices)."""

from __future__ import annotations

import subprocess
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


def test_setup_copies_the_checkout_and_installs_jax_tpu_on_every_worker():
    lines = dry_run("setup.sh")
    assert lines[0].startswith("git -C ") and "archive --format=tar.gz --prefix=samtone_jax/" in lines[0]
    assert lines[1].startswith("gcloud compute tpus tpu-vm scp /tmp/samtone_jax.tar.gz samtone:\\~/")
    assert "--worker=all" in lines[1] and "--worker=all" in lines[2]
    assert "jax\\[tpu\\]==0.10.2" in lines[2] and "tpu-vm ssh samtone" in lines[2]


def test_train_runs_the_same_command_on_every_worker_and_logs_reads_host_0():
    lines = dry_run("train.sh", "--", "--gin_file=runs/finetune_multireqa.gin", "--gin.MODEL_DIR='gs://b/run'")
    assert lines[0].startswith("gcloud compute tpus tpu-vm ssh samtone --zone=us-central2-b --worker=all --command=")
    assert "samtone\\ train\\ --multihost\\ --gin_file=runs/finetune_multireqa.gin" in lines[0]
    assert "gs://b/run" in lines[0]
    assert dry_run("logs.sh")[0].startswith("gcloud compute tpus tpu-vm ssh samtone --zone=us-central2-b --worker=0")


def test_delete_and_missing_flags():
    assert dry_run("delete.sh") == ["gcloud compute tpus tpu-vm delete samtone --zone=us-central2-b --quiet "]
    assert dry_run("delete.sh", "--queued")[0].startswith("gcloud compute tpus queued-resources delete samtone")
    bad = subprocess.run(["bash", str(TPU / "create.sh"), "--zone=z"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--name=NAME and --zone=ZONE are required" in bad.stderr


@pytest.mark.parametrize("argv", [[], ["two", "train"]])
def test_local_launcher_usage(argv):
    out = subprocess.run(["bash", str(TPU.parent / "local.sh"), *argv], capture_output=True, text=True)
    assert out.returncode == 2 and "usage:" in out.stderr
