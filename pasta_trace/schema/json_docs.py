"""Fields of the JSON documents (manifest, reports)."""

from __future__ import annotations


#: manifest.json: the JSON type of each key a reader uses (pasta_trace.json_doc
#: shapes: a type, [shape] for an array, {key: shape} for an object).  A
#: manifest where one of them has another type is refused; other keys are free,
#: and any key may be missing or null.
MANIFEST_SHAPE: dict = {
    "format_version": str,
    "complete": bool,
    "command_line": [str],
    "mode": str,
    "host": str,
    "kernel_release": str,
    "clock": {"start_ns": int, "end_ns": int,
              "start_sample": {"realtime_ns": int, "mono_before_ns": int, "mono_after_ns": int},
              "end_sample": {"realtime_ns": int, "mono_before_ns": int, "mono_after_ns": int}},
    "counts": {"lost_events": int, "lost_names": int},
}

#: timeline.json of a merged timeline (`merge_stats`: pasta_trace.merge.MergeStats's fields, all integers).
TIMELINE_SHAPE: dict = {
    "format_version": str,
    "capture_manifest": MANIFEST_SHAPE,
    "merge_stats": {},
    "problems": [str],
}
