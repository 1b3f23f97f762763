#!/usr/bin/env bash
# Start the same training command on every worker (JAX's multi-controller runtime: one process per
# host, jax.distributed.initialize() discovers the pod). MODEL_DIR and data must be on gs://.
#   launch/tpu/train.sh --name=samtone --zone=us-central2-b [--dry-run] -- \
#     --gin_file=models/t5_1_1_base.gin --gin_file=architectures/ade_spl.gin --gin_file=runs/finetune_multireqa.gin \
#     --gin.TASK="'multireqa_squad'" --gin.MODEL_DIR="'gs://BUCKET/runs/squad'" --gin.DATA_DIR="'gs://BUCKET/data'" \
#     --gin.INIT_CHECKPOINT="'gs://BUCKET/ckpt/t5_1_1_base_ade_spl'"
# Rerunning the same command resumes from MODEL_DIR's last checkpoint (e.g. after a preemption).
source "$(dirname "$0")/common.sh"
GIN=()
for arg in "${EXTRA_ARGS[@]}"; do [[ "$arg" != "--" ]] && GIN+=("$arg"); done
QUOTED="$(printf '%q ' "${GIN[@]}")"
on_workers all "cd samtone_jax && nohup .venv/bin/samtone train --multihost ${QUOTED}> train.log 2>&1 &"
echo "# stream host 0's log with: launch/tpu/logs.sh --name=$NAME --zone=$ZONE"
