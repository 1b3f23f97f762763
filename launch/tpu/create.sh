#!/usr/bin/env bash
# Create a TPU VM pod slice: launch/tpu/create.sh --name=samtone --zone=us-central2-b --accelerator=v4-32 [--queued] [--spot] [--dry-run]
source "$(dirname "$0")/common.sh"
if [[ "$QUEUED" == 1 ]]; then
  SPOT_FLAG=(); [[ "$SPOT" == 1 ]] && SPOT_FLAG=(--spot)
  run gcloud compute tpus queued-resources create "$NAME" --node-id="$NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
    --accelerator-type="$ACCELERATOR" --runtime-version="$VERSION" "${SPOT_FLAG[@]}"
  run gcloud compute tpus queued-resources describe "$NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --format="value(state.state)"
else
  SPOT_FLAG=(); [[ "$SPOT" == 1 ]] && SPOT_FLAG=(--spot)
  run gcloud compute tpus tpu-vm create "$NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
    --accelerator-type="$ACCELERATOR" --version="$VERSION" "${SPOT_FLAG[@]}"
fi
