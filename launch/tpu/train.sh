#!/usr/bin/env bash
# Start the same training command on every worker (JAX's multi-controller runtime: one process per
# host, jax.distributed.initialize() discovers the pod). MODEL_DIR and data must be on gs://.
#   launch/tpu/train.sh --name=samtone --zone=us-central2-b [--dry-run] -- \
#     --gin_file=models/t5_1_1_base.gin --gin_file=architectures/ade_spl.gin --gin_file=runs/finetune_multireqa.gin \
#     --gin.TASK="'multireqa_squad'" --gin.MODEL_DIR="'gs://BUCKET/runs/squad'" --gin.DATA_DIR="'gs://BUCKET/data'" \
#     --gin.INIT_CHECKPOINT="'gs://BUCKET/ckpt/t5_1_1_base_ade_spl'"
# Rerunning the same command resumes from MODEL_DIR's last checkpoint (e.g. after a preemption).
# The same as launch/tpu/run.sh ... train -- ...; the log is appended to ~/samtone_logs/train.log.
exec bash "$(dirname "$0")/run.sh" train "$@"
