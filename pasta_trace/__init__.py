"""pasta-trace: trace CUDA and HIP activity of running GPU programs.

The rooms, in the order data flows through them:

    probes/      which libraries and symbols, and the BPF program's text
    capture/     attach, drain the ring buffers, write the capture directory
    daemon/      the flight recorder: the last window of events in memory, dumped as captures
    stacks/      the callers' Python and native stacks of the events
    device/      device record files and CUPTI records, read into frames
    read.py      a capture directory opened as frames (json_shape.py checks its JSON)
    merge/       host and device on one clock: the timeline, the cluster timeline
    tools/       the analyses, each a table from a capture or timeline
    reporters/   terminal, JSON, HTML and CSV output of the tools' tables
    export/      trace formats for viewers (Perfetto, Chrome)
    commands/    one module per verb; cli.py parses and dispatches
    schema       every record layout, the one source of truth

dask_cluster.py runs the cross-rank tools on a Dask cluster."""
__version__ = "0.1.0"
