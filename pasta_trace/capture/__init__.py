"""Capture: from the probes' rings to a capture directory, while the traced
processes run.  One subpackage per concern:

* ``session/``: one capture from start to end (options, checks, the session, finish, summary, dry run);
* ``bpf/``: the BPF runtime (loading and attaching the program, rings, maps; its text is probes.program's);
* ``procs/``: the processes traced (discovery, targets, tracking, launch, late loads, their guardian and the
  tracer's end);
* ``output/``: events on their way to disk (drain, shared ring, events writer, decode, Parquet, manifest);
* ``naming/``: names behind handles (attach-time names, stub symbols, pairing, build-ids);
* ``stacks/``: the capture's side of Python and native stacks.

Capture does no analysis; nothing here imports merge, tools, reporters or commands."""
