"""Trace formats for the viewers (`export --format perfetto|chrome`): the
trace model both are built from (trace_model.py), Perfetto's protobuf trace
(perfetto.py, written with protowire.py) and Chrome's JSON trace (chrome.py).
The report pages and CSV tables are reporters (pasta_trace.reporters)."""
