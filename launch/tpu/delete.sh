#!/usr/bin/env bash
# Delete the slice: launch/tpu/delete.sh --name=samtone --zone=us-central2-b [--queued] [--dry-run]
source "$(dirname "$0")/common.sh"
if [[ "$QUEUED" == 1 ]]; then
  run gcloud compute tpus queued-resources delete "$NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --force --quiet
else
  run gcloud compute tpus tpu-vm delete "$NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --quiet
fi
