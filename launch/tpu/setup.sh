#!/usr/bin/env bash
# Install this checkout on every worker: launch/tpu/setup.sh --name=samtone --zone=us-central2-b [--dry-run]
# Packs the working tree (pack.sh: uncommitted edits and new files included, and listed), copies it to
# every worker, replaces ~/samtone_jax there (logs live in ~/samtone_logs and survive), then runs
# worker_setup.sh: Python 3.11, the venv ~/samtone_venv from requirements.lock + jax[tpu], kept while
# the lock is unchanged. Rerun it after a preemption recreated the slice, or after editing code.
source "$(dirname "$0")/common.sh"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
TARBALL="/tmp/samtone_jax.tar.gz"
run bash "$REPO/launch/tpu/pack.sh" "$TARBALL"
run gcloud compute tpus tpu-vm scp "$TARBALL" "$NAME:~/" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=all
on_workers all "set -eo pipefail; mkdir -p samtone_logs && rm -rf samtone_jax.new && mkdir samtone_jax.new && \
tar xzf samtone_jax.tar.gz -C samtone_jax.new --strip-components=1 && rm -rf samtone_jax && mv samtone_jax.new samtone_jax && \
bash samtone_jax/launch/tpu/worker_setup.sh 2>&1 | tee -a samtone_logs/setup.log"
