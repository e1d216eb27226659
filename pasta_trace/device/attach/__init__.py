"""Loading the CUPTI collector into a running process (`pasta-trace -p PID --device cupti`):
ptrace.py (the syscalls), target.py (what the process is and when not to touch it),
remote.py (a function call on one of its threads), collector.py (the collector's protocol).
docs/device.md, "Attaching to a running process"."""
