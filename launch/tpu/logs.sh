#!/usr/bin/env bash
# Stream host 0's training log: launch/tpu/logs.sh --name=samtone --zone=us-central2-b [--dry-run]
source "$(dirname "$0")/common.sh"
on_workers 0 "tail -n 100 -f samtone_jax/train.log"
