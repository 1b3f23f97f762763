#!/usr/bin/env bash
# Install this checkout on every worker: launch/tpu/setup.sh --name=samtone --zone=us-central2-b [--dry-run]
# Copies a tarball of the repository (git-tracked files), then builds a venv with jax[tpu] on each worker.
source "$(dirname "$0")/common.sh"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
TARBALL="/tmp/samtone_jax.tar.gz"
run git -C "$REPO" archive --format=tar.gz --prefix=samtone_jax/ -o "$TARBALL" HEAD
run gcloud compute tpus tpu-vm scp "$TARBALL" "$NAME:~/" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=all
on_workers all "rm -rf samtone_jax && tar xzf samtone_jax.tar.gz && cd samtone_jax && python3 -m venv .venv && \
.venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q 'jax[tpu]==0.10.2' -e '.[export]' \
-f https://storage.googleapis.com/jax-releases/libtpu_releases.html && \
.venv/bin/python -c 'import jax; print(jax.process_index(), jax.device_count(), jax.devices()[0].device_kind)'"
