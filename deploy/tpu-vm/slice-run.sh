#!/usr/bin/env bash
# Start one FAR session on every worker of a multi-host Cloud TPU VM slice (e.g. v5e-16:
# 4 workers x 4 chips). Each worker runs the same `far run --distributed`; JAX joins them into
# one program (jax.distributed finds the slice's workers itself on Cloud TPU) and JAX process
# 0 alone writes the records, run.json and the run lease. Run it from any machine with gcloud
# (or a Cloud Scheduler job); the workers need FAR installed (tpu-vm/startup.sh does it).
#
#   deploy/tpu-vm/slice-run.sh TPU_NAME ZONE gs://BUCKET/far [SESSION_BUDGET]
#
set -euo pipefail

if [ "$#" -lt 3 ]; then
  echo "usage: $0 TPU_NAME ZONE STORAGE_ROOT [SESSION_BUDGET]" >&2
  exit 2
fi
tpu="$1"
zone="$2"
root="$3"
budget="${4:-5h45m}"
recipe=recipes/tpu-gemma3-1b-v5e16-multihost.yaml

# --worker=all: the same command on every worker, at the same time; each one's exit status
# comes back. FAR_CACHE_DIR and the venv are where tpu-vm/startup.sh put them.
gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all --command "
  cd /opt/far && JAX_PLATFORMS=tpu FAR_CACHE_DIR=/var/cache/far \
    /opt/far-venv/bin/far run $recipe --root '$root' --session-budget '$budget' --distributed
"
