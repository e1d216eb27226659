"""The caller's stack on every event: finding the interpreter of a process
(interpreter, offsets) and reading its code objects (pycode).  The capture
collects what the BPF walker (bpf/pystack.h) reports with them
(capture/stacks/stack_collector.py)."""
