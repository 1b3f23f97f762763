#!/usr/bin/env bash
# Stream host 0's log of a mode: launch/tpu/logs.sh --name=samtone --zone=us-central2-b [--log=train] [--worker=0] [--dry-run]
# Logs are appended across runs and setups (~/samtone_logs/MODE.log, each run headed by a "===" line).
source "$(dirname "$0")/common.sh"
LOG=train WORKER=0
for arg in "${EXTRA_ARGS[@]}"; do
  case "$arg" in
    --log=*) LOG="${arg#*=}" ;;
    --worker=*) WORKER="${arg#*=}" ;;
    *) echo "logs.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
on_workers "$WORKER" "tail -n 100 -F samtone_logs/$LOG.log"
