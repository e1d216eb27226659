#!/usr/bin/env bash
# The test command: set up (idempotent), then run the whole suite as root.
# Live eBPF tests need root: run as a user, this re-runs itself under sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/as_root.sh
scripts/setup.sh
# One process by default. PASTA_TRACE_TEST_WORKERS=N runs it on N
# pytest-xdist workers, each test file whole on one: a capture start is ~15 s
# of one core compiling the BPF program, so two cores nearly halve the suite,
# but such a run once stopped making progress at 98% (not explained yet), so
# it is not the default.
workers=${PASTA_TRACE_TEST_WORKERS:-0}
if [ "$workers" = 0 ]; then
  exec .venv/bin/python -m pytest -q -ra --durations=40 "$@"
fi
exec .venv/bin/python -m pytest -q -ra --durations=40 -n "$workers" --dist loadfile "$@"
