"""The processes a capture traces: which ones it may (reach) and starts with (targets, discovery), the
command it launches (launch, needed), their lives (tracker, processes), libraries loaded late and the
processes stopped at their open (late_load, guardian), the interpreter-finalization hold (finalize_probe),
reading their memory (process_memory) and the tracer's own helper processes (helper_process, own_process)."""
