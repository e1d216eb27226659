"""The processes a capture traces: which ones it may (reach) and starts with (targets, discovery, and the
libraries a Python environment holds: python_env), the command it launches (launch, needed), their lives
(tracker, processes), libraries loaded late and the processes stopped at their open (late_load, guardian;
tracer_end: the tracer's end as its guardians and the takeover of its capture see it), the
interpreter-finalization hold (finalize_probe), reading their memory (process_memory) and the tracer's own
helper processes (helper_process, own_process)."""
