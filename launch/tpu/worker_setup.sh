#!/usr/bin/env bash
# Runs on each TPU VM worker, from the unpacked checkout (setup.sh calls it):
#   bash samtone_jax/launch/tpu/worker_setup.sh [--python=python3.11] [--venv=$HOME/samtone_venv] [--dry-run]
# 1. Python 3.11 (the project's version: jax 0.10.2 and the lock are resolved for it). The TPU images
#    (tpu-ubuntu2204-base: Ubuntu 22.04) ship Python 3.10, so python3.11 comes from the deadsnakes PPA.
# 2. A venv outside the checkout, rebuilt only when requirements.lock changes: the lock itself (torch's
#    CPU wheel from PyTorch's index), then jax[tpu] (libtpu) at the lock's jax version.
# 3. This checkout installed editable into it, and a check that JAX sees the TPU.
# --dry-run prints the commands (shell-quoted) and runs none of them.
set -euo pipefail
PYTHON=python3.11 VENV="$HOME/samtone_venv" DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --python=*) PYTHON="${arg#*=}" ;;
    --venv=*) VENV="${arg#*=}" ;;
    --dry-run) DRY_RUN=1 ;;
    *) echo "worker_setup.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
LOCK="$REPO/requirements.lock"
JAX_VERSION="$(sed -n 's/^jax==//p' "$LOCK")"
if [[ -z "$JAX_VERSION" ]]; then
  echo "worker_setup.sh: $LOCK pins no jax==VERSION" >&2
  exit 2
fi
run() {
  printf '%q ' "$@"
  printf '\n'
  if [[ "$DRY_RUN" == 0 ]]; then "$@"; fi
}

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  if [[ "$PYTHON" != python3.11 ]]; then
    echo "worker_setup.sh: $PYTHON is not on PATH" >&2
    exit 2
  fi
  echo "# $PYTHON is not installed (Ubuntu 22.04 ships Python 3.10): installing it from the deadsnakes PPA"
  run sudo DEBIAN_FRONTEND=noninteractive apt-get update -qq
  run sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq software-properties-common
  run sudo add-apt-repository -y ppa:deadsnakes/ppa
  run sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv python3.11-dev
fi
if [[ "$DRY_RUN" == 0 || -n "$(command -v "$PYTHON" || true)" ]]; then
  VERSION="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [[ "$VERSION" != 3.11 ]]; then
    echo "worker_setup.sh: $PYTHON is Python $VERSION; samtone_jax's lock is resolved for Python 3.11 (jax 0.10.2)." >&2
    echo "  Pass --python=python3.11 (installed from ppa:deadsnakes/ppa when missing)." >&2
    exit 2
  fi
fi

STAMP="$VENV/.lock.sha256"
WANT="$(sha256sum "$LOCK" | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "# $VENV matches requirements.lock: kept"
else
  run rm -rf "$VENV"
  run "$PYTHON" -m venv "$VENV"
  run "$VENV/bin/pip" install -q --upgrade pip
  run "$VENV/bin/pip" install -q -r "$LOCK" --extra-index-url https://download.pytorch.org/whl/cpu
  run "$VENV/bin/pip" install -q "jax[tpu]==$JAX_VERSION" -f https://storage.googleapis.com/jax-releases/libtpu_releases.html
  if [[ "$DRY_RUN" == 0 ]]; then echo "$WANT" > "$STAMP"; fi
fi
run "$VENV/bin/pip" install -q --no-deps --no-build-isolation --config-settings editable_mode=compat -e "$REPO"
run "$VENV/bin/python" -c 'import jax; print("process", jax.process_index(), "sees", jax.device_count(), "devices:", jax.devices()[0].device_kind)'
