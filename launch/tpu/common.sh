# Shared flag parsing for the Cloud TPU scripts. Every script accepts:
#   --name=NAME (TPU VM / queued resource name)   --zone=ZONE   --project=PROJECT (optional)
#   --accelerator=v4-32 | v5p-128 | ...           --version=RUNTIME (tpu-ubuntu2204-base)
#   --queued (use queued resources)  --spot  --dry-run (print the exact commands, run nothing)
# plus script-specific flags, left in EXTRA_ARGS.
set -euo pipefail

NAME="" ZONE="" PROJECT="" ACCELERATOR="v4-32" VERSION="tpu-ubuntu2204-base" QUEUED=0 SPOT=0 DRY_RUN=0
EXTRA_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --name=*) NAME="${arg#*=}" ;;
    --zone=*) ZONE="${arg#*=}" ;;
    --project=*) PROJECT="${arg#*=}" ;;
    --accelerator=*) ACCELERATOR="${arg#*=}" ;;
    --version=*) VERSION="${arg#*=}" ;;
    --queued) QUEUED=1 ;;
    --spot) SPOT=1 ;;
    --dry-run) DRY_RUN=1 ;;
    *) EXTRA_ARGS+=("$arg") ;;
  esac
done
if [[ -z "$NAME" || -z "$ZONE" ]]; then
  echo "$(basename "$0"): --name=NAME and --zone=ZONE are required (see docs/TPU.md)" >&2
  exit 2
fi
PROJECT_FLAG=()
[[ -n "$PROJECT" ]] && PROJECT_FLAG=(--project="$PROJECT")

# run CMD...: print the command (shell-quoted), then run it unless --dry-run.
run() {
  printf '%q ' "$@"
  printf '\n'
  if [[ "$DRY_RUN" == 0 ]]; then
    "$@"
  fi
}

# on_workers WORKERS COMMAND: the same shell command on the TPU VM workers ("all" or "0").
on_workers() {
  run gcloud compute tpus tpu-vm ssh "$NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker="$1" --command="$2"
}
