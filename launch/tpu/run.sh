#!/usr/bin/env bash
# Start a samtone mode on the pod, in the background, its output appended to ~/samtone_logs/MODE.log:
#   launch/tpu/run.sh --name=samtone --zone=us-central2-b [--worker=all|0] [--dry-run] MODE -- [samtone flags...]
#   launch/tpu/run.sh --name=samtone --zone=us-central2-b eval -- --gin.evaluate.model_dir="'gs://BUCKET/runs/squad'"
# train, train-adore, eval, encode and average (a uniform soup, each host its shards) run on every
# worker with --multihost (one process per host, the same command everywhere; with --worker=N, on
# that worker alone, without it: e.g. average --task, a greedy soup); every other mode (export,
# mine, score, import-checkpoint, ...) runs on worker 0 alone. Follow it with launch/tpu/logs.sh --log=MODE. Rerunning a train command resumes it.
source "$(dirname "$0")/common.sh"
MODE="" WORKER="" ARGS=()
for arg in "${EXTRA_ARGS[@]}"; do
  if [[ "$arg" == --worker=* ]]; then WORKER="${arg#*=}"
  elif [[ -z "$MODE" && "$arg" != "--" ]]; then MODE="$arg"
  elif [[ "$arg" != "--" ]]; then ARGS+=("$arg")
  fi
done
if [[ ! "$MODE" =~ ^[a-z][a-z-]*$ ]]; then
  echo "$(basename "$0"): name the samtone mode (train, eval, encode, export, mine, ...) before -- (see docs/TPU.md)" >&2
  exit 2
fi
case "$MODE" in
  train|train-adore|eval|encode|average) DEFAULT_WORKER=all ;;
  *) DEFAULT_WORKER=0 ;;
esac
WORKER="${WORKER:-$DEFAULT_WORKER}"
# one process per host joins the pod's runtime; a mode on one worker (e.g. a greedy soup) runs alone
if [[ "$DEFAULT_WORKER" == all && "$WORKER" == all ]]; then ARGS=(--multihost "${ARGS[@]}"); fi
QUOTED="$(printf '%q ' "$MODE" "${ARGS[@]}")"
on_workers "$WORKER" "mkdir -p samtone_logs && cd samtone_jax && \
echo === \$(date -u +%FT%TZ) \$(hostname) samtone ${QUOTED}>> ../samtone_logs/$MODE.log && \
nohup ../samtone_venv/bin/samtone ${QUOTED}>> ../samtone_logs/$MODE.log 2>&1 &"
echo "# follow it with: launch/tpu/logs.sh --name=$NAME --zone=$ZONE --log=$MODE"
