"""`pasta-trace report --html`: one self-contained HTML page (no network, one
small inline script): the capture's facts, the key findings, a zoomable
timeline, live device memory and tensor memory (stacked by call site) on one
time axis, flame graphs of time
blocked in syncs, bytes allocated and bytes live at the peak, a hotness heat
map (pages x kernel executions) and every tool's table, sortable.

Every time on the page, in tables and on the plots' axes, counts in seconds
from the capture's start."""

from __future__ import annotations

import functools
from html import escape
from importlib import resources
from string import Template
from typing import TextIO

import polars as pl

from ... import __version__, merge
from ...read import Capture
from ...tools.findings import Finding
from ...tools.flame import flames
from ...tools.gpu import page_launch_matrix
from ...tools.memory import memory_timeline
from ...tools.render import format_frame, human_ns
from ...tools.run import ToolResult, device_data_text, incomplete_banner, lost_text
from ...tools.tensors import site_steps, tensor_timeline
from ..results import Results
from . import plots
from .flame import flame_svg
from .heatmap import heatmap_svg
from .tensors import TOP_SITES as TOP_TENSOR_SITES, tensor_memory_svg

#: rows per table in the page; the full data is in --json and CSV
TABLE_ROWS = 200
#: long free text goes after the numbers, so that the numbers line up at the left
LAST_COLUMNS = ("cmdline", "container_id")
NO_DEVICE = "needs device data (gpu_probes or CUPTI); this capture has none"


@functools.cache
def _asset(name: str) -> str:
    """page.html, style.css or script.js: package data beside this module,
    inlined into every page so that the page loads nothing from anywhere."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _template() -> Template:
    return Template(_asset("page.html"))


def _facts_html(facts: dict) -> str:
    rows = [
        ("capture", facts["path"]), ("command", facts["command"]), ("mode", facts["mode"]),
        ("host", facts["host"]), ("kernel", facts["kernel"]), ("started (UTC)", facts["started_utc"]),
        ("duration", None if facts["duration_ns"] is None else human_ns(facts["duration_ns"])),
        ("processes", ", ".join(map(str, facts["pids"])) or "none"), ("events", f"{facts['events']:,}"),
        ("calls counted", None if facts.get("aggregate_calls") is None else f"{facts['aggregate_calls']:,} (--aggregate)"),
        ("lost", lost_text(facts)), ("device data", device_data_text(facts)),
    ]
    return "".join(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>" for k, v in rows if v is not None)


def _findings_html(findings: list[Finding]) -> str:
    def text(f: Finding) -> str:
        if f.subject is None:
            return escape(f.text)
        before, after = f.text.split("{subject}", 1)
        return f"{escape(before)}<code>{escape(f.subject)}</code>{escape(after)}"

    rows = "".join(
        f'<dt>{escape(f.topic)}</dt><dd>{text(f)} <a href="#tool-{f.tool}">details</a></dd>' for f in findings
    )
    return f'<dl class="findings">{rows}</dl>'


def _table_html(r: ToolResult, t0: int | None) -> str:
    df = r.frame
    if {"name", "display_name"} <= set(df.columns):  # a kernel is shown once, as the terminal shows it
        df = df.with_columns(pl.coalesce("display_name", "name").alias("display_name")).drop("name")
    df = df.select([c for c in df.columns if c not in LAST_COLUMNS] + [c for c in LAST_COLUMNS if c in df.columns])
    cols = format_frame(df, t0, TABLE_ROWS)
    shown = df.head(TABLE_ROWS)
    # headers say what and in which unit; their title is the column's name in --json and CSV
    head = "".join(
        f'<th title="{escape(c.name)}"{" class=num" if c.numeric else ""}>{escape(c.header)}</th>' for c in cols
    )

    def td(c, raw: object, text: str) -> str:
        if c.numeric:  # the raw value sorts; the text reads
            return f'<td class="num" data-v="{"" if raw is None else raw}">{escape(text)}</td>'
        return f'<td{" class=wrap" if c.cut == "wrap" else ""}>{escape(text)}</td>'

    raws = [shown[c.name].to_list() for c in cols]
    body = "".join(
        "<tr>" + "".join(td(c, raw[i], c.cells[i]) for c, raw in zip(cols, raws)) + "</tr>"
        for i in range(shown.height)
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


ZOOMBAR = (
    '<div class="zoombar"><button data-zoom="in" title="zoom in">+</button>'
    '<button data-zoom="out" title="zoom out">&minus;</button><button data-zoom="left" title="earlier">&larr;</button>'
    '<button data-zoom="right" title="later">&rarr;</button><button data-zoom="reset">whole capture</button>'
    '<span id="zoom-range"></span><span class="hint">drag across a plot to zoom into that range; ctrl+wheel '
    "zooms; a double-click shows the whole capture</span></div>"
)


def _time_sections(cap: Capture, facts: dict, by_name: dict[str, ToolResult]) -> list[str]:
    kernels = merge.kernel_executions(cap)
    t0, t1 = _activity(cap, kernels)
    if t0 is None:
        return [_section("timeline", "Timeline overview", "", '<p class="note">no events recorded</p>')]
    w = plots.Window(t0, t1, facts["start_ts_ns"] if facts["start_ts_ns"] is not None else t0)
    mem = by_name["memory"].frame if "memory" in by_name else memory_timeline(cap)
    return [
        _section(
            "timeline", "Timeline overview",
            "API calls per host thread (one band per kind) and kernel executions per GPU stream; hover for "
            "details. Times are seconds after the capture started, as in the tables; the plots begin at the "
            f"first traced call{plots.time_span_note(w)}.",
            ZOOMBAR + plots.timeline_svg(cap.events, kernels, w),
        ),
        _section(
            "memory", "Device memory over time",
            "Live device bytes per process (allocations minus frees; pinned host memory excluded); dots mark "
            "peaks. Same time axis as the timeline, zoomed with it.",
            plots.memory_svg(mem, w) if mem.height else '<p class="note">no device allocations</p>',
        ),
    ] + _tensor_section(cap, w, by_name)


def _tensor_section(cap: Capture, w: plots.Window, by_name: dict[str, ToolResult]) -> list[str]:
    """Tensor memory stacked by call site, for captures with tensor events (PyTorch)."""
    tl = by_name["tensor_memory"].frame if "tensor_memory" in by_name else tensor_timeline(cap)
    if tl.height == 0:
        return []
    return [_section(
        "tensors", "Tensor memory over time (PyTorch)",
        "Tensor bytes held per process and device, stacked by the Python line that allocated them (the top "
        f"{TOP_TENSOR_SITES} lines; the rest together), with the allocator's bytes from before the capture at the "
        "bottom and what it reserved from the driver dashed on top. Never summed with the device memory above: the "
        "allocator's segments are those allocations. Zooms with the timeline.",
        tensor_memory_svg(site_steps(cap).collect(engine="streaming"), tl, w),
    )]


def _flame_section(cap: Capture) -> str:
    if cap.stacks.select(pl.len()).collect().item() == 0:
        content = ('<p class="note">no call stacks in this capture (recorded with --no-stacks, '
                   "or no Python callers)</p>")
    else:
        content = "".join(f"<h3>{escape(f.title)}</h3>{flame_svg(f)}" for f in flames(cap))
    return _section(
        "flames", "Flame graphs",
        "Who made the calls: each bar is a frame, as wide as the time or bytes of the calls beneath it, callers "
        "above callees, one process per bar under the top. Hover for function (file:line).",
        content,
    )


def _heatmap_section(cap: Capture, facts: dict) -> str:
    if facts["device_data"]:
        matrix = page_launch_matrix(cap)
        heat = heatmap_svg(matrix) if matrix.height else '<p class="note">the device data has no page histograms</p>'
    else:
        heat = f'<p class="note">{NO_DEVICE}</p>'
    return _section(
        "heatmap", "Hotness: pages x kernel executions",
        "Accesses per page (rows, the hottest 64 in address order) and kernel execution (columns, the first 64 launches).",
        heat,
    )


def render_html(cap: Capture, facts: dict, results: list[ToolResult], findings: list[Finding]) -> str:
    by_name = {r.tool.name: r for r in results}
    sections = []
    if findings:
        sections.append(_section("findings", "Key findings", "", _findings_html(findings)))
    sections += _time_sections(cap, facts, by_name)
    sections.append(_flame_section(cap))
    sections.append(_heatmap_section(cap, facts))
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
        for sid, label in [("findings", "key findings")] * bool(findings)
        + [("timeline", "timeline chart"), ("memory", "memory chart")]  # "memory" alone is also a tool
        + [("tensors", "tensor memory chart")] * any(s.startswith('<section id="tensors"') for s in sections)
        + [("flames", "flame graphs"), ("heatmap", "heat map")]
        + [(f"tool-{r.tool.name}", r.tool.name) for r in results]
    )
    return _template().substitute(
        title=escape(facts["path"]), style=_asset("style.css"), plot_style=plots.css(), facts=_facts_html(facts),
        banner=f'<div class="banner" id="incomplete">{escape(banner)}</div>' if banner else "",
        nav=nav, sections="".join(sections), version=escape(__version__), script=_asset("script.js"),
    )


class HtmlReporter:
    def render(self, results: Results, out: TextIO) -> None:
        out.write(render_html(results.cap, results.facts, results.tools, results.findings))
