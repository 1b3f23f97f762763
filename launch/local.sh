#!/usr/bin/env bash
# N processes on this machine over jax.distributed (localhost coordinator, gloo collectives), each
# with its own CPU devices: the code path of a TPU pod, testable on a laptop.
#   launch/local.sh N [--devices=K] [--port=P] [--logs=DIR] MODE [samtone flags...]
#   launch/local.sh 2 --devices=2 train --gin_file=runs/demo_cpu.gin --gin.MODEL_DIR="'/tmp/run2x2'"
# Process i logs to DIR/process_i.log (default /tmp/samtone_local). If any process fails, the others
# are stopped and the script exits with that process's status.
set -euo pipefail
if [[ $# -lt 2 || ! "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 N [--devices=K] [--port=P] [--logs=DIR] MODE [samtone flags...]" >&2
  exit 2
fi
N="$1"; shift
DEVICES=1 PORT=$((20000 + RANDOM % 20000)) LOGS=/tmp/samtone_local
while [[ $# -gt 0 ]]; do
  case "$1" in
    --devices=*) DEVICES="${1#*=}"; shift ;;
    --port=*) PORT="${1#*=}"; shift ;;
    --logs=*) LOGS="${1#*=}"; shift ;;
    *) break ;;
  esac
done
MODE="$1"; shift
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
mkdir -p "$LOGS"
# Each process sets its own device count (--num_cpu_devices); other XLA flags pass through.
XLA_FLAGS="$(echo "${XLA_FLAGS:-}" | sed -E 's/--xla_force_host_platform_device_count=[0-9]+//g')"
export XLA_FLAGS
PIDS=()
for ((i = 0; i < N; i++)); do
  "$PYTHON" -m samtone_jax.cli.main "$MODE" --coordinator_address="127.0.0.1:$PORT" --num_processes="$N" \
    --process_id="$i" --num_cpu_devices="$DEVICES" "$@" > "$LOGS/process_$i.log" 2>&1 &
  PIDS+=($!)
done
status=0
for ((i = 0; i < N; i++)); do
  wait "${PIDS[$i]}" || status=$?
  if [[ $status != 0 ]]; then
    echo "process $i failed (exit $status); stopping the others; log: $LOGS/process_$i.log" >&2
    kill "${PIDS[@]}" 2>/dev/null || true
    break
  fi
done
wait 2>/dev/null || true
exit "$status"
