#!/usr/bin/env bash
# The working tree as a tarball for the TPU workers: launch/tpu/pack.sh OUT.tar.gz [--repo=DIR]
# Every file git tracks (as it is on disk now, uncommitted edits included) and every untracked file
# git does not ignore (a new gin file), under samtone_jax/; deleted files are left out, ignored ones
# (.venv, runs/) never go. Lists the uncommitted files it carries, so a run's code is never a surprise.
set -euo pipefail
OUT="" REPO="$(cd "$(dirname "$0")/../.." && pwd)"
for arg in "$@"; do
  case "$arg" in
    --repo=*) REPO="${arg#*=}" ;;
    -*) echo "pack.sh: unknown flag $arg (usage: pack.sh OUT.tar.gz [--repo=DIR])" >&2; exit 2 ;;
    *) OUT="$arg" ;;
  esac
done
if [[ -z "$OUT" ]]; then
  echo "usage: pack.sh OUT.tar.gz [--repo=DIR]" >&2
  exit 2
fi
if ! git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "pack.sh: $REPO is not a git checkout (the file list comes from git)" >&2
  exit 2
fi
LIST="$(mktemp)"
trap 'rm -f "$LIST"' EXIT
# tracked + untracked-not-ignored, minus tracked files deleted on disk
git -C "$REPO" ls-files -z --cached --others --exclude-standard \
  | python3 -c 'import os, sys; root = sys.argv[1]; names = sys.stdin.buffer.read().split(b"\0"); sys.stdout.buffer.write(b"".join(n + b"\0" for n in dict.fromkeys(names) if n and os.path.lexists(os.path.join(root.encode(), n))))' "$REPO" \
  > "$LIST"
CHANGED="$(git -C "$REPO" status --porcelain --untracked-files=all)"
if [[ -n "$CHANGED" ]]; then
  echo "# carrying uncommitted changes (commit them to record what ran):"
  echo "$CHANGED" | sed 's/^/#   /'
fi
tar -C "$REPO" --null -T "$LIST" --transform 's,^,samtone_jax/,' -czf "$OUT"
echo "# packed $(tr -cd '\0' < "$LIST" | wc -c) files of $(git -C "$REPO" rev-parse --short HEAD) into $OUT"
