#!/usr/bin/env bash
# Cloud TPU VM startup script: install FAR and run a Prefect process worker under systemd.
# Every flow run of the far-tpu-vm deployment then starts on this VM, in the installed
# repository (prefect.yaml's pull step changes into $FAR_REPO_DIR).
#
# Give it to the VM as its startup script, with its settings as instance metadata:
#   gcloud compute tpus tpu-vm create far-v5e8 --zone=us-west4-a \
#     --accelerator-type=v5litepod-8 --version=v2-alpha-tpuv5-lite \
#     --metadata-from-file=startup-script=deploy/tpu-vm/startup.sh \
#     --metadata=prefect-api-url=https://PREFECT_HOST/api,far-repo-url=https://github.com/ORG/far.git
# Metadata read (attributes):
#   prefect-api-url          the Prefect API the worker polls (required)
#   far-repo-url             git URL of this repository (required)
#   far-repo-ref             branch, tag or commit to run (default: main)
#   far-work-pool            the process work pool (default: far-tpu-vm, as in prefect.yaml)
#   prefect-api-key-secret   Secret Manager secret holding a Prefect Cloud API key (optional)
# Runs as root at every boot; safe to run again (reinstalls only when the lock changed).
set -euo pipefail

FAR_REPO_DIR=/opt/far
FAR_VENV=/opt/far-venv
FAR_CACHE_DIR=/var/cache/far
METADATA=http://metadata.google.internal/computeMetadata/v1/instance/attributes

metadata() {  # metadata NAME [DEFAULT]: an instance attribute, or DEFAULT, or fail
  local value
  if value="$(curl -sf -H 'Metadata-Flavor: Google' "$METADATA/$1")"; then
    echo "$value"
  elif [ "$#" -ge 2 ]; then
    echo "$2"
  else
    echo "startup.sh: instance metadata attribute '$1' is required" >&2
    return 1
  fi
}

api_url="$(metadata prefect-api-url)"
repo_url="$(metadata far-repo-url)"
repo_ref="$(metadata far-repo-ref main)"
pool="$(metadata far-work-pool far-tpu-vm)"
key_secret="$(metadata prefect-api-key-secret '')"

# Python 3.11 (TPU VM images ship an older python3) and git.
if ! command -v python3.11 > /dev/null; then
  apt-get update -q
  apt-get install -y -q python3.11 python3.11-venv git
fi

# The repository at the requested ref.
if [ ! -d "$FAR_REPO_DIR/.git" ]; then
  git clone --quiet "$repo_url" "$FAR_REPO_DIR"
fi
git -C "$FAR_REPO_DIR" fetch --quiet origin "$repo_ref"
git -C "$FAR_REPO_DIR" checkout --quiet --force FETCH_HEAD

# The virtual environment from the lock, with the TPU extra; again only when the lock changed.
stamp="$FAR_VENV/.installed-$(sha256sum "$FAR_REPO_DIR/requirements.lock" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  rm -rf "$FAR_VENV"
  FAR_PYTHON=python3.11 bash "$FAR_REPO_DIR/deploy/install.sh" "$FAR_VENV" tpu
  touch "$stamp"
fi
mkdir -p "$FAR_CACHE_DIR" /etc/far

# The worker's environment: flow runs inherit it (FAR_REPO_DIR fills prefect.yaml's pull step).
umask 077
{
  echo "PREFECT_API_URL=$api_url"
  echo "FAR_REPO_DIR=$FAR_REPO_DIR"
  echo "FAR_CACHE_DIR=$FAR_CACHE_DIR"
  echo "PREFECT_LOGGING_EXTRA_LOGGERS=stages"
  if [ -n "$key_secret" ]; then
    echo "PREFECT_API_KEY=$(gcloud secrets versions access latest --secret="$key_secret")"
  fi
} > /etc/far/worker.env
umask 022

# The work pool, if nobody created it yet.
set -a
# shellcheck source=/dev/null
. /etc/far/worker.env
set +a
"$FAR_VENV/bin/prefect" work-pool inspect "$pool" > /dev/null 2>&1 \
  || "$FAR_VENV/bin/prefect" work-pool create "$pool" --type process

# systemd sends SIGTERM to every process of the unit on stop, reboot or preemption: the
# flow run gets it too, and training saves its step and stops (TimeoutStopSec to finish).
cat > /etc/systemd/system/far-worker.service <<UNIT
[Unit]
Description=Prefect process worker for FAR (pool $pool)
Wants=network-online.target
After=network-online.target

[Service]
EnvironmentFile=/etc/far/worker.env
WorkingDirectory=$FAR_REPO_DIR
ExecStart=$FAR_VENV/bin/prefect worker start --pool $pool --type process --name %H
Restart=always
RestartSec=10
KillSignal=SIGTERM
TimeoutStopSec=180

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable far-worker.service
systemctl restart far-worker.service
echo "startup.sh: far-worker polling pool '$pool' at $api_url ($(git -C "$FAR_REPO_DIR" rev-parse --short HEAD))"
