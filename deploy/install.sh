#!/usr/bin/env bash
# Install FAR into a virtual environment from the pinned lock, plus an extra (default: the
# TPU one, jax[tpu] with libtpu). One script for the TPU VM, the Docker image and Kaggle, so
# all three run exactly the versions the tests ran.
# Usage: deploy/install.sh VENV_DIR [EXTRA]     EXTRA "tpu" (default) or "" for CPU only
# Python: $FAR_PYTHON (default python3.11; FAR needs >= 3.11).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:?usage: deploy/install.sh VENV_DIR [EXTRA]}"
extra="${2-tpu}"
python="${FAR_PYTHON:-python3.11}"

# The reward sandbox (stages/rewards/sandbox.py): bubblewrap and libseccomp from the system.
if ! command -v bwrap > /dev/null || ! /sbin/ldconfig -p | grep -q libseccomp.so.2; then
  if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2
  else
    echo "warning: install bubblewrap and libseccomp2 (apt-get install bubblewrap libseccomp2);" \
      "without them FAR refuses recipes unless they set 'sandbox: {isolation: process}'" >&2
  fi
fi

# The commit, for records written where there is no .git later (an image keeps this file).
if commit="$(git -C "$repo" rev-parse HEAD 2>/dev/null)"; then
  printf '{"git_commit": "%s"}\n' "$commit" > "$repo/stages/_build_info.json"
fi
"$python" -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade "pip==26.3"
# The lock's torch (a +cpu build) only serves the tests' comparisons against transformers;
# it is not on PyPI's default index and TPU hosts do not need it.
grep -v '^torch==' "$repo/requirements.lock" > "$venv/far-requirements.txt"
"$venv/bin/pip" install --quiet --no-deps -r "$venv/far-requirements.txt"
if [ -n "$extra" ]; then
  "$venv/bin/pip" install --quiet -e "${repo}[${extra}]"  # with deps: adds only the extra's
else
  "$venv/bin/pip" install --quiet --no-deps -e "$repo"
fi
"$venv/bin/far" --help > /dev/null  # the console script imports
echo "FAR installed in $venv (extra: ${extra:-none})"
