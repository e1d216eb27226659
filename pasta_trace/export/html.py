"""`pasta-trace report --html`: one self-contained HTML file (no script, no
network): header facts, a timeline overview, live device memory over time, a
hotness heat map (pages x kernel executions) and every tool's table, with the
plots as inline SVG."""

from __future__ import annotations

from html import escape

import polars as pl

from .. import __version__, merge
from ..read import Capture
from ..tools.findings import Finding
from ..tools.hotness import page_launch_matrix
from ..tools.memory import memory_timeline
from ..tools.render import cell, human_ns
from ..tools.run import ToolResult, incomplete_banner
from . import html_plots

#: rows per table in the page; the full data is in --json and CSV
TABLE_ROWS = 200

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d232a;background:#f4f5f7}
header{background:#1d2b3a;color:#fff;padding:18px 28px}
header h1{margin:0 0 8px;font-size:22px;font-weight:600}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:0;font-size:13px}
dl.facts dt{color:#9fb3c8}dl.facts dd{margin:0;font-family:ui-monospace,monospace}
.banner{background:#c62828;color:#fff;font-weight:700;padding:10px 28px;font-size:15px}
nav{padding:8px 28px;background:#e4e7eb;font-size:13px}nav a{margin-right:14px;color:#1d4e89;white-space:nowrap;display:inline-block}
section{background:#fff;margin:16px 28px;padding:14px 18px;border-radius:6px;box-shadow:0 1px 2px #0002}
section h2{font-size:17px;margin:0 0 4px}section p.desc{margin:0 0 10px;color:#52606d;font-size:13px}
p.note{color:#7b8794;font-style:italic}
svg.plot{display:block;max-width:100%;height:auto}
svg text{font:11px system-ui,sans-serif;fill:#3e4c59}
.axis,.tick{stroke:#7b8794}.grid{stroke:#e4e7eb}
.legend{font-size:12px;margin:6px 0 0 190px}.key{margin-right:14px;white-space:nowrap}.key svg{margin-right:4px;vertical-align:middle}
.ramp{display:inline-block;width:120px;height:10px;margin-right:8px;vertical-align:middle;
background:linear-gradient(90deg,rgb(255,245,235),rgb(127,39,4))}
table.tool{border-collapse:collapse;font-size:12px;width:100%}
table.tool th{text-align:left;background:#f0f2f5;padding:4px 8px;border-bottom:1px solid #cbd2d9;position:sticky;top:0}
table.tool td{padding:3px 8px;border-bottom:1px solid #eef0f2;font-family:ui-monospace,monospace;white-space:nowrap}
table.tool td.num{text-align:right}table.tool caption{caption-side:bottom;text-align:left;color:#7b8794;padding-top:4px}
.scroll{max-height:480px;overflow:auto}
footer{color:#7b8794;font-size:12px;padding:8px 28px 24px}
"""


def _facts_html(facts: dict) -> str:
    rows = [
        ("capture", facts["path"]), ("command", facts["command"]), ("mode", facts["mode"]),
        ("host", facts["host"]), ("kernel", facts["kernel"]), ("started (UTC)", facts["started_utc"]),
        ("duration", None if facts["duration_ns"] is None else human_ns(facts["duration_ns"])),
        ("processes", ", ".join(map(str, facts["pids"])) or "none"), ("events", f"{facts['events']:,}"),
        ("calls counted", None if facts.get("aggregate_calls") is None else f"{facts['aggregate_calls']:,} (--aggregate)"),
        ("lost events", f"{facts['lost_events']:,}"), ("device data", "yes" if facts["device_data"] else "no"),
    ]
    return "".join(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>" for k, v in rows if v is not None)


def _table_html(r: ToolResult, t0: int | None) -> str:
    df = r.frame
    numeric = [df.schema[c].is_numeric() for c in df.columns]
    head = "".join(f"<th>{escape(c)}</th>" for c in df.columns)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{escape(cell(c, v, t0))}</td>' if num else f"<td>{escape(cell(c, v, t0))}</td>"
            for c, v, num in zip(df.columns, row, numeric)
        ) + "</tr>"
        for row in df.head(TABLE_ROWS).iter_rows()
    )
    caption = (
        f"<caption>{TABLE_ROWS} of {df.height} rows; all of them: pasta-trace report --json, "
        f"or pasta-trace export --format csv</caption>" if df.height > TABLE_ROWS else ""
    )
    return (
        f'<div class="scroll"><table class="tool" id="table-{r.tool.name}">{caption}'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def _section(sid: str, title: str, desc: str, content: str) -> str:
    return f'<section id="{sid}"><h2>{escape(title)}</h2><p class="desc">{escape(desc)}</p>{content}</section>'


def _activity(cap: Capture, kernels: pl.LazyFrame) -> tuple[int | None, int | None]:
    """First and last instant anything was recorded (host calls, kernel executions).
    The plots span this window, not the tracer's: a program traced from its
    launch may spend seconds before its first GPU call."""
    host = cap.events.select(
        pl.col("ts_ns").min().alias("a"), (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max().alias("b")
    )
    gpu = kernels.select(pl.col("gpu_start_ns").min().alias("a"), pl.col("gpu_end_ns").max().alias("b"))
    row = pl.concat([host, gpu]).select(pl.col("a").min(), pl.col("b").max()).collect(engine="streaming").row(0)
    return row[0], row[1]


def render_html(cap: Capture, facts: dict, results: list[ToolResult], findings: list[Finding]) -> str:
    by_name = {r.tool.name: r for r in results}
    sections = []
    kernels = merge.kernel_executions(cap)
    w0, w1 = _activity(cap, kernels)
    if w0 is None:
        sections.append(_section("timeline", "Timeline overview", "", '<p class="note">no events recorded</p>'))
    else:
        late = w0 - facts["start_ts_ns"] if facts["start_ts_ns"] is not None else 0
        since = f" ({human_ns(late)} after tracing started)" if late > 0 else ""
        sections.append(_section(
            "timeline", "Timeline overview",
            "API calls per host thread (one band per kind) and kernel executions per GPU stream; hover for details. "
            f"Time runs from the first traced call{since}.",
            html_plots.timeline_svg(cap.events, kernels, w0, w1),
        ))
        mem_frame = by_name["memory"].frame if "memory" in by_name else memory_timeline(cap)
        sections.append(_section(
            "memory", "Device memory over time",
            "Live device bytes per process (allocations minus frees; pinned host memory excluded); dots mark peaks. "
            "Same time axis as the timeline.",
            html_plots.memory_svg(mem_frame, w0, w1) if mem_frame.height else '<p class="note">no device allocations</p>',
        ))
    if facts["device_data"]:
        matrix = page_launch_matrix(cap)
        heat = html_plots.heatmap_svg(matrix) if matrix.height else '<p class="note">the device data has no page histograms</p>'
    else:
        heat = '<p class="note">needs device data (gpu_probes or CUPTI); this capture has none</p>'
    sections.append(_section(
        "heatmap", "Hotness: pages x kernel executions",
        "Accesses per page (rows, the hottest 64 in address order) and kernel execution (columns, the first 64 launches).",
        heat,
    ))
    for r in results:
        if r.note:
            content = f'<p class="note">{escape(r.note)}</p>'
        elif r.frame.height == 0:
            content = '<p class="note">nothing found</p>'
        else:
            content = _table_html(r, facts["start_ts_ns"])
        sections.append(_section(f"tool-{r.tool.name}", r.tool.title, r.tool.description, content))
    banner = incomplete_banner(facts)
    nav = "".join(
        f'<a href="#{sid}">{escape(label)}</a>'
        for sid, label in [("timeline", "timeline"), ("memory", "memory"), ("heatmap", "heat map")]
        + [(f"tool-{r.tool.name}", r.tool.name) for r in results]
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>pasta-trace report: {escape(facts['path'])}</title>"
        f"<style>{_STYLE}{html_plots.css()}</style></head><body>"
        f'<header><h1>pasta-trace report</h1><dl class="facts">{_facts_html(facts)}</dl></header>'
        + (f'<div class="banner" id="incomplete">{escape(banner)}</div>' if banner else "")
        + f"<nav>{nav}</nav>" + "".join(sections)
        + f"<footer>pasta-trace {escape(__version__)}</footer></body></html>\n"
    )
