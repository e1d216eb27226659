#!/usr/bin/env bash
# The test command: set up (idempotent), then run the whole suite as root.
# Live eBPF tests need root: run as a user, this re-runs itself under sudo.
#
# Two phases.  First every test not marked machine_wide, on
# PASTA_TRACE_TEST_WORKERS pytest-xdist workers (default 2, each test file
# whole on one worker): a capture start is seconds of one core compiling and
# loading BPF, so two cores nearly halve the suite.  Then the machine_wide
# tests (pyproject.toml: -a, top, the daemon, what counts the machine's
# processes), one at a time, alone: run beside another test they would see
# its processes.  Arguments go to both phases (a phase that selects nothing
# is not a failure unless both select nothing).  PASTA_TRACE_TEST_WORKERS=0
# runs everything in one process, in file order.
#
# Every test has --timeout seconds (pytest-timeout): one that hangs fails
# with its threads' stacks instead of holding the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/as_root.sh
scripts/setup.sh
workers=${PASTA_TRACE_TEST_WORKERS:-2}
common=(-q -ra --timeout=900)
if [ "$workers" = 0 ]; then
  exec .venv/bin/python -m pytest "${common[@]}" --durations=40 "$@"
fi
started=$SECONDS
rc1=0
.venv/bin/python -m pytest "${common[@]}" --durations=30 -n "$workers" --dist loadfile -m "not machine_wide" "$@" || rc1=$?
echo "phase 1 (${workers} workers, not machine_wide): exit ${rc1} after $((SECONDS - started)) s"
rc2=0
.venv/bin/python -m pytest "${common[@]}" --durations=15 -m machine_wide "$@" || rc2=$?
echo "phase 2 (machine_wide, alone): exit ${rc2}; ${SECONDS}s in all"
# 5: no test selected
if [ "$rc1" = 5 ] && [ "$rc2" = 5 ]; then exit 5; fi
for rc in "$rc1" "$rc2"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then exit "$rc"; fi
done
exit 0
