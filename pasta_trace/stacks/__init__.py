"""The caller's stack on every event: finding the interpreter of a process
(interpreter, offsets), reading its code objects (pycode), and collecting the
stacks the BPF walker (bpf/pystack.h) reports into stacks.parquet
(collector)."""
