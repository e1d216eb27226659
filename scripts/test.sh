#!/usr/bin/env bash
# The test command: set up (idempotent), then run the whole suite as root.
# Live eBPF tests need root: run as a user, this re-runs itself under sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/as_root.sh
scripts/setup.sh
# Two workers, each test file whole on one (its module fixtures, users and
# builds made once): a capture start is ~15 s of one core compiling the BPF
# program, so the suite is CPU-bound and two cores halve it.
# PASTA_TRACE_TEST_WORKERS=0 runs it in one process.
workers=${PASTA_TRACE_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then
  exec .venv/bin/python -m pytest -q -ra --durations=40 "$@"
fi
exec .venv/bin/python -m pytest -q -ra --durations=40 -n "$workers" --dist loadfile "$@"
