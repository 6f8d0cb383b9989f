#!/usr/bin/env bash
# Run FAR's unit tier and fast integration tier against any Tunix source tree, in a venv of its
# own (the project's .venv is never touched), and print passed/failed per tier.
#
#   bench/tunix_tree_check.sh PATH_TO_TUNIX_TREE [VENV]     (docs/tunix-main.md)
#
# VENV (default /tmp/venv-tunix-check) is built once: requirements.lock without dependencies,
# then the Tunix tree over google-tunix, then FAR itself in editable mode. Delete it to
# rebuild. The tiers run with FAR_ALLOW_UNTESTED_TUNIX=1 (tunix_version.py), one at a time
# under /tmp/far-heavy.lock; TIERS="unit" runs one tier only. Logs and JUnit files go to
# $OUT (default /tmp/tunix-check).
set -euo pipefail

TREE=${1:?usage: bench/tunix_tree_check.sh PATH_TO_TUNIX_TREE [VENV]}
VENV=${2:-/tmp/venv-tunix-check}
OUT=${OUT:-/tmp/tunix-check}
TIERS=${TIERS:-unit integration}
FAR=$(cd "$(dirname "$0")/.." && pwd)
TREE=$(cd "$TREE" && pwd)
FIND_LINKS=${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}
[ -f "$TREE/pyproject.toml" ] && [ -d "$TREE/tunix" ] || {
  echo "$TREE: expected a Tunix source tree (pyproject.toml and tunix/)" >&2
  exit 2
}

if [ ! -x "$VENV/bin/pytest" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "uv==0.13.8"
  UV="$VENV/bin/uv pip install --quiet --python $VENV/bin/python --no-deps"
  $UV ${FIND_LINKS:+--find-links "$FIND_LINKS"} -r "$FAR/requirements.lock"
  $UV "$TREE"
  $UV -e "$FAR"
fi
"$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --no-deps --reinstall "$TREE"

mkdir -p "$OUT"
export PYTHONPATH=$FAR JAX_PLATFORMS=cpu FAR_ALLOW_UNTESTED_TUNIX=1
cd "$FAR"
echo "Tunix tree: $TREE ($("$VENV/bin/python" -c \
  'import importlib.metadata as m; print("google-tunix", m.version("google-tunix"))'))"
for tier in $TIERS; do
  flock /tmp/far-heavy.lock nice -n 10 timeout 1500 "$VENV/bin/pytest" -q -m "not slow" \
    "tests/$tier" -p no:randomly -rfE --junitxml="$OUT/$tier.xml" >"$OUT/$tier.log" 2>&1 || true
done
"$VENV/bin/python" - "$OUT" $TIERS <<'EOF'
import sys
import xml.etree.ElementTree as ET

out, tiers = sys.argv[1], sys.argv[2:]
for tier in tiers:
    try:
        suite = ET.parse(f"{out}/{tier}.xml").getroot().find("testsuite")
    except (OSError, ET.ParseError) as error:
        print(f"{tier}: no result ({error}); see {out}/{tier}.log")
        continue
    total, failed, errors, skipped = (
        int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")
    )
    print(
        f"{tier}: {total - failed - errors - skipped} passed, {failed} failed, "
        f"{errors} errors, {skipped} skipped ({out}/{tier}.log)"
    )
    for case in suite.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            print(f"  FAILED {case.get('classname')}::{case.get('name')}")
EOF
