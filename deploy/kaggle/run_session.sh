#!/usr/bin/env bash
# One Kaggle TPU session of a FAR run: install FAR (once per session), then `far run` until
# the session budget, stopping cleanly with every finished step saved to gs://. Run the same
# command in the next session: finished stages are skipped and training resumes at its
# saved step.
#
# Usage: bash deploy/kaggle/run_session.sh RECIPE STORAGE_ROOT [SESSION_BUDGET]
#   bash far/deploy/kaggle/run_session.sh far/recipes/kaggle-gemma2-2b-v5e8.yaml \
#       gs://BUCKET/far 8h45m
# SESSION_BUDGET defaults to 8h45m: a Kaggle TPU session lasts 9 hours, and the install and
# the final checkpoint save need the rest.
# Environment: FAR_VENV (default /tmp/far-venv; reused when it already has `far`),
#   FAR_PYTHON (python for a new venv), FAR_CACHE_DIR (converted weights, default ~/.cache/far).
# Exit codes are `far run`'s: 0 complete; 3 session budget reached, run again next session;
#   2 invalid recipe or input; anything else is a failure.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
recipe="${1:?usage: run_session.sh RECIPE STORAGE_ROOT [SESSION_BUDGET]}"
root="${2:?usage: run_session.sh RECIPE STORAGE_ROOT [SESSION_BUDGET]}"
budget="${3:-8h45m}"
venv="${FAR_VENV:-/tmp/far-venv}"

if [ ! -x "$venv/bin/far" ]; then
  bash "$repo/deploy/install.sh" "$venv" tpu || { echo "far: install failed" >&2; exit 1; }
fi

"$venv/bin/far" run "$recipe" --root "$root" --session-budget "$budget"
status=$?
case "$status" in
  0) echo "far: run complete; everything is under $root" ;;
  3) echo "far: session budget reached; in the next session run this same command" \
          "to continue from $root" ;;
  *) echo "far: run failed with exit code $status" >&2 ;;
esac
exit "$status"
