"""The node daemon's flight recorder: every GPU process of the machine traced
as `-a` does, the last seconds of events kept in memory (window), written out
as an ordinary capture directory on demand (dump), through a Unix socket
(control) or SIGUSR1 (service).  docs/daemon.md describes it."""
