#!/usr/bin/env bash
# The test command: set up (idempotent), then run the whole suite as root.
# Live eBPF tests need root: run as a user, this re-runs itself under sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/as_root.sh
scripts/setup.sh
exec .venv/bin/python -m pytest -q -ra --durations=40 "$@"
