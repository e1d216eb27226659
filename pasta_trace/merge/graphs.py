"""CUDA graphs: the kernels each graph launch runs, worked out from the
capture's graph calls (probes.catalog._graphs).

A graph is defined by a stream capture's end (`ptr` = the graph, `dst` = the
capture id its captured launches carry) or by cuGraphCreate (`ptr`), and
grows by kernel nodes (kind `captured`, `ptr` = the graph) and child graphs
(`src`, whose nodes are copied in when added).  Instantiation makes an exec
(`func`) of what the graph holds then; each launch of the exec runs those
kernels once.  Handles are reused after a destroy, so every link is the
latest one before in time (an as-of join per process and handle).

A graph launch whose exec was instantiated before the capture began (an
attach after the warm-up of a vLLM or torch.compile program) runs kernels
this capture never saw: it is one row named `graph@0x<exec>` with the reason,
never a guess.  So is the graph of a capture that began before the trace (its
end carries no capture id); the launches made on its stream before that end
were recorded, not run, and are no launch rows (precaptured_launches).  A stream joined to a capture
through an event (cross-stream capture) carries its origin's capture id: its launches are that graph's nodes.
Copies and memsets made under capture are kind `captured` too; only the captured launches are kernel nodes.

With CUPTI device data (device format 1.2), the kernels a graph launch ran
are known from the device: CUPTI gives each kernel of a graph its graph and
node ids and the correlation id of the graph launch call, so one correlation
id is one graph launch (device_graph_kernels).  Such a graph launch's rows are
then its device kernels, one each, whatever the host saw of the graph; the
host's estimate stays beside them for comparison (graph_launch_counts).  Each
device kernel takes its handle and call site from the host node it ran
(_node_of_each_kernel): found by name and shape, since in a graph with
parallel branches the GPU's start order need not be the capture order."""

from __future__ import annotations

import polars as pl

from ..hexfmt import hex_expr
from ..probes.catalog import APIS, GRAPH_LAUNCHES
from ..read import Capture
from ..schema import Kind

#: the launch rows' columns a graph launch has no value for per kernel
GRAPH_COLUMNS = {"via_graph": pl.Boolean, "graph_exec": pl.UInt64}
UNKNOWN_REASON = ("graph instantiated before the trace began: the kernels its launches run were not seen "
                  "(trace from before the capture or graph construction to count them)")
PARTIAL_REASON = ("graph captured on a stream whose capture began before the trace: the kernels its launches run "
                  "were not all seen")

_SHAPES = {a.symbol: a.shape for a in APIS}
_CAPTURE_ENDS = [s for s, sh in _SHAPES.items() if sh == "capture_end"]
_CREATES = [s for s, sh in _SHAPES.items() if sh == "graph_create"]
_KERNEL_NODES = [s for s, sh in _SHAPES.items() if sh == "graph_kernel_node"]
_CHILDREN = [s for s, sh in _SHAPES.items() if sh == "graph_child_node"]
_INSTANTIATES = [s for s, sh in _SHAPES.items() if sh == "graph_instantiate"]
#: the launch APIs: of the captured events, those that are kernel nodes (not a copy or memset)
_LAUNCHES = [a.symbol for a in APIS if a.kind == Kind.launch]
#: the kernel columns a node carries onto each launch of its graph
_KERNEL = ["func", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "shmem", "caller", "caller_fp"]
#: nested children are followed this deep
_MAX_DEPTH = 16
#: what a device kernel and a host node of one graph launch are paired by, the first that
#: pairs every kernel of the launch: name and shape, name, place (_node_of_each_kernel)
_PAIRINGS = (["name", *_KERNEL[1:7]], ["name"], [])
#: the host node's columns a device kernel takes
_LENT = ["func", "shmem", "caller", "caller_fp"]


def _graph_calls(cap: Capture) -> pl.DataFrame:
    """The capture's graph and captured events, small: held in cap.cache."""
    key = ("graph_calls",)
    if key not in cap.cache:
        kind = pl.col("kind").cast(pl.String)
        nested_node = (kind == "nested") & pl.col("api").cast(pl.String).is_in(_KERNEL_NODES)
        cap.cache[key] = cap.events.filter(kind.is_in(["graph", "captured"]) | nested_node).with_columns(
            pl.col("api").cast(pl.String), kind.alias("kind"),
            (pl.col("ret").is_null() | (pl.col("ret") == 0)).alias("_ok"),
        ).collect()
    return cap.cache[key]


def _asof(left: pl.DataFrame, right: pl.DataFrame, by: list[str], left_on: str, right_on: str) -> pl.DataFrame:
    """The latest `right` row at or before each `left` row, per `by`; both sorted
    first (join_asof does not check)."""
    return left.sort([*by, left_on]).join_asof(right.sort([*by, right_on]), left_on=left_on, right_on=right_on,
                                               by=by, strategy="backward", check_sortedness=False)


def _definitions(ev: pl.DataFrame) -> pl.DataFrame:
    """(pid, graph, def_ts): each graph handle's making (capture end or create)."""
    made = ev.filter(pl.col("api").is_in(_CAPTURE_ENDS + _CREATES) & pl.col("_ok") & pl.col("ptr").is_not_null())
    return made.select("pid", pl.col("ptr").alias("graph"), pl.col("ts_ns").alias("def_ts"))


def _nodes(ev: pl.DataFrame, defs: pl.DataFrame) -> pl.DataFrame:
    """(pid, graph, def_ts, node_ts, kernel columns): the kernels each graph
    definition holds, children's included, each with the time it joined."""
    ends = ev.filter(pl.col("api").is_in(_CAPTURE_ENDS) & pl.col("dst").is_not_null() & pl.col("ptr").is_not_null())
    captured = ev.filter((pl.col("kind") == "captured") & pl.col("dst").is_not_null()
                         & pl.col("api").is_in(_LAUNCHES)).join(
        ends.select("pid", "dst", pl.col("ptr").alias("graph"), pl.col("ts_ns").alias("def_ts")),
        on=["pid", "dst"], how="inner")
    cols = ["pid", "graph", "def_ts", pl.col("ts_ns").alias("node_ts"), *_KERNEL]
    explicit = ev.filter((pl.col("kind") == "captured") & pl.col("api").is_in(_KERNEL_NODES) & pl.col("_ok")
                         & pl.col("ptr").is_not_null()).rename({"ptr": "graph"})
    explicit = _asof(explicit, defs, ["pid", "graph"], "ts_ns", "def_ts").drop_nulls("def_ts")
    # a runtime kernel node names its kernel by host stub; the driver node made inside it
    # has the CUfunction, which the driver's lookups named
    inner = ev.filter((pl.col("kind") == "nested") & pl.col("func").is_not_null()).select(
        "pid", "tid", pl.col("outer_ts_ns").alias("ts_ns"), pl.col("func").alias("_inner"))
    explicit = explicit.join(inner, on=["pid", "tid", "ts_ns"], how="left").with_columns(
        pl.coalesce("_inner", "func").alias("func"))
    own = pl.concat([captured.select(cols), explicit.select(cols)])
    children = ev.filter(pl.col("api").is_in(_CHILDREN) & pl.col("_ok") & pl.col("ptr").is_not_null()
                         & pl.col("src").is_not_null()).select("pid", pl.col("ptr").alias("graph"),
                                                               pl.col("src").alias("child"), "ts_ns")
    if children.is_empty():
        return own
    children = _asof(children, defs, ["pid", "graph"], "ts_ns", "def_ts").drop_nulls("def_ts")
    children = _asof(children, defs.rename({"graph": "child", "def_ts": "child_def"}), ["pid", "child"], "ts_ns",
                     "child_def").drop_nulls("child_def")
    nodes = own
    for _ in range(_MAX_DEPTH):
        # a child's nodes as its parent holds them: those it had when it was added
        inherited = children.join(nodes.rename({"graph": "child", "def_ts": "child_def", "node_ts": "_t"}),
                                  on=["pid", "child", "child_def"]).filter(pl.col("_t") < pl.col("ts_ns"))
        grown = pl.concat([own, inherited.select(cols)])
        if grown.height == nodes.height:
            break
        nodes = grown
    return nodes


def _instances(ev: pl.DataFrame, defs: pl.DataFrame) -> pl.DataFrame:
    """(pid, exec, inst_ts, graph, def_ts): each instantiation, with the graph
    definition it was made from (def_ts null: the graph was made before the
    trace)."""
    inst = ev.filter(pl.col("api").is_in(_INSTANTIATES) & pl.col("_ok") & pl.col("func").is_not_null()
                     & pl.col("ptr").is_not_null())
    inst = inst.select("pid", pl.col("func").alias("exec"), pl.col("ts_ns").alias("inst_ts"),
                       pl.col("ptr").alias("graph"))
    return _asof(inst, defs, ["pid", "graph"], "inst_ts", "def_ts")


def graph_launches(cap: Capture) -> pl.DataFrame:
    """Each graph launch (the outermost call: a runtime launch holds the
    driver's) with its exec's instantiation (inst_ts null: before the trace)
    and graph definition."""
    key = ("graph_launches",)
    if key not in cap.cache:
        ev = _graph_calls(cap)
        defs = _definitions(ev)
        launches = ev.filter((pl.col("kind") == "graph") & pl.col("api").is_in(list(GRAPH_LAUNCHES))
                             & pl.col("func").is_not_null()).with_row_index("_launch")
        out = _asof(launches.rename({"func": "exec"}), _instances(ev, defs), ["pid", "exec"], "ts_ns", "inst_ts")
        cap.cache[key] = out.sort("_launch")
    return cap.cache[key]


def _partial(ev: pl.DataFrame) -> pl.DataFrame:
    """(pid, graph, def_ts) of graphs whose capture began before the trace:
    their end carries no capture id."""
    return ev.filter(pl.col("api").is_in(_CAPTURE_ENDS) & pl.col("_ok") & pl.col("ptr").is_not_null()
                     & pl.col("dst").is_null()).select("pid", pl.col("ptr").alias("graph"),
                                                       pl.col("ts_ns").alias("def_ts"))


def precaptured_launches(cap: Capture) -> pl.DataFrame:
    """(pid, stream, ts_ns) of the launch events that were made on a stream
    whose capture began before the trace (its end carries no capture id): the
    probes saw no begin, so they are kind `launch`, yet they were recorded,
    not run.  Those after the stream's previous capture end, before this one."""
    key = ("precaptured_launches",)
    if key in cap.cache:
        return cap.cache[key]
    out = pl.DataFrame(schema={"pid": pl.UInt32, "stream": pl.UInt64, "ts_ns": pl.Int64})
    ev = _graph_calls(cap)
    if not ev.is_empty():
        ends = ev.filter(pl.col("api").is_in(_CAPTURE_ENDS) & (pl.col("kind") == "graph")
                         & pl.col("stream").is_not_null()).sort("ts_ns").with_columns(
            pl.col("ts_ns").shift(1).over("pid", "stream").fill_null(-1).alias("since"))
        blind = ends.filter(pl.col("dst").is_null()).select("pid", "stream", "since", pl.col("ts_ns").alias("until"))
        if blind.height:
            launches = cap.events.filter((pl.col("kind") == "launch") & pl.col("stream").is_in(blind["stream"].unique().to_list())
                                         ).select("pid", "stream", "ts_ns").collect()
            out = launches.join(blind, on=["pid", "stream"]).filter(
                (pl.col("ts_ns") > pl.col("since")) & (pl.col("ts_ns") < pl.col("until"))).select(out.columns)
    cap.cache[key] = out
    return out


def _host_nodes_per_launch(cap: Capture, launches: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The known graph launches' kernel rows from the host's graph calls, in
    node order with `pos`, and the launches whose kernels were not seen."""
    ev = _graph_calls(cap)
    nodes = _nodes(ev, _definitions(ev))
    partial = _partial(ev).with_columns(pl.lit(True).alias("_partial"))
    launches = launches.join(partial, on=["pid", "graph", "def_ts"], how="left")
    known = launches.filter(pl.col("def_ts").is_not_null() & pl.col("_partial").is_null())
    ran = known.drop(*[c for c in _KERNEL if c in known.columns]).join(
        nodes, on=["pid", "graph", "def_ts"], how="inner").filter(pl.col("node_ts") < pl.col("inst_ts"))
    ran = ran.sort(["_launch", "node_ts"]).with_columns(pl.int_range(pl.len()).over("_launch").alias("pos"))
    unknown = launches.filter(pl.col("def_ts").is_null() | pl.col("_partial").is_not_null())
    return ran, unknown


_DEVICE_GRAPH_SCHEMA = {"pid": pl.UInt32, "correlation_id": pl.UInt32, "_launch": pl.UInt32, "pos": pl.Int64,
                        "start": pl.Int64, "graph_id": pl.UInt32, "graph_node_id": pl.UInt64, "name": pl.String,
                        **{c: pl.UInt32 for c in _KERNEL[1:7]}}


def device_graph_kernels(cap: Capture) -> pl.DataFrame:
    """CUPTI's kernel records of graph launches (graph_id not 0), each with
    the host graph launch it ran for (`_launch`, a row of graph_launches; null
    when none) and its position in that launch (`pos`, by start on the GPU).

    The kernels of one graph launch share its call's correlation id.  Those
    groups, in correlation order, are a process's graph launches in call
    order: the k-th group is the k-th host graph launch where the counts agree
    and every group starts after its launch; otherwise (graph launches made
    before the trace, or lost) each group goes to the latest graph launch of
    its process before its first kernel started, and of two groups before one
    launch the second goes to none."""
    key = ("device_graph_kernels",)
    if key in cap.cache:
        return cap.cache[key]
    out = pl.DataFrame(schema=_DEVICE_GRAPH_SCHEMA)
    k = cap.device["cupti_kernels"].filter(pl.col("graph_id") != 0).select(
        "pid", "correlation_id", pl.col("start").cast(pl.Int64), "graph_id", "graph_node_id", "name",
        *_KERNEL[1:7]).collect()
    if k.height:
        k = k.sort("pid", "correlation_id", "start", "graph_node_id").with_columns(
            pl.int_range(pl.len()).over("pid", "correlation_id").alias("pos"))
        groups = k.group_by("pid", "correlation_id").agg(pl.col("start").min().alias("_first")).sort(
            "pid", "correlation_id").with_columns(pl.int_range(pl.len()).over("pid").alias("_k"))
        host = graph_launches(cap).select("pid", "_launch", "ts_ns").sort("pid", "ts_ns", "_launch").with_columns(
            pl.int_range(pl.len()).over("pid").alias("_k"))
        by_order = groups.join(host, on=["pid", "_k"], how="left")
        counts = groups.group_by("pid").len("_dev").join(host.group_by("pid").len("_host"), on="pid", how="left")
        in_order = by_order.group_by("pid").agg(
            (pl.col("ts_ns").is_not_null() & (pl.col("ts_ns") <= pl.col("_first"))).all().alias("_causal")).join(
            counts, on="pid").filter(pl.col("_causal") & (pl.col("_dev") == pl.col("_host")))["pid"]
        by_time = _asof(groups.filter(~pl.col("pid").is_in(in_order.implode())),
                        host.drop("_k"), ["pid"], "_first", "ts_ns")
        assigned = pl.concat([by_order.filter(pl.col("pid").is_in(in_order.implode())).select(
            "pid", "correlation_id", "_launch"), by_time.select("pid", "correlation_id", "_launch")])
        # two groups before one launch (the host lost the other's): the first keeps it, the
        # other joins none rather than a guess
        assigned = assigned.sort("pid", "correlation_id").with_columns(
            pl.when(pl.col("_launch").is_first_distinct()).then(pl.col("_launch")).alias("_launch"))
        out = k.join(assigned, on=["pid", "correlation_id"], how="left").select(
            [pl.col(c).cast(t) for c, t in _DEVICE_GRAPH_SCHEMA.items()]).sort("pid", "correlation_id", "pos")
    cap.cache[key] = out
    return out


def graph_launch_counts(cap: Capture) -> pl.DataFrame:
    """Per host graph launch: pid, tid, ts_ns, exec, the kernels the host
    worked out from the graph calls it saw (`host_kernels`, null where the
    graph was not seen) and those CUPTI recorded for it (`device_kernels`,
    null without CUPTI graph records for it), with its correlation id."""
    launches = graph_launches(cap)
    schema = {"pid": pl.UInt32, "tid": pl.UInt32, "ts_ns": pl.Int64, "exec": pl.UInt64,
              "host_kernels": pl.UInt32, "device_kernels": pl.UInt32, "correlation_id": pl.UInt32}
    if launches.is_empty():
        return pl.DataFrame(schema=schema)
    ran, unknown = _host_nodes_per_launch(cap, launches)
    host = ran.group_by("_launch").len("host_kernels")
    dev = device_graph_kernels(cap).drop_nulls("_launch").group_by("_launch").agg(
        pl.len().alias("device_kernels"), pl.col("correlation_id").first())
    known = launches.join(unknown.select("_launch"), on="_launch", how="anti").select("_launch")
    return launches.join(host, on="_launch", how="left").join(dev, on="_launch", how="left").with_columns(
        pl.when(pl.col("_launch").is_in(known["_launch"].implode()))
        .then(pl.col("host_kernels").fill_null(0)).alias("host_kernels"),
    ).sort("_launch").select([pl.col(c).cast(t) for c, t in schema.items()])


def _node_names(cap: Capture, nodes: pl.DataFrame) -> pl.DataFrame:
    """`nodes` (pid, func, ts_ns) with `name`: the handle's latest name at
    ts_ns, else any name of it (names found offline carry no time), as
    kernels.kernel_names names the launch rows; null where none was seen."""
    names = cap.names.select("pid", pl.col("handle").alias("func"), "name",
                             pl.col("ts_ns").fill_null(0).alias("_name_ts")).drop_nulls(["func", "name"]).collect()
    per_handle = names.sort("_name_ts").group_by("pid", "func").agg(pl.len().alias("_names"),
                                                                    pl.col("name").first().alias("_any"))
    nodes = nodes.join(per_handle, on=["pid", "func"], how="left")
    # only a renamed handle (a module reloaded) needs the as-of join, which sorts every row
    renamed = pl.col("_names").fill_null(0) > 1
    timed = _asof(nodes.filter(renamed), names, ["pid", "func"], "ts_ns", "_name_ts").drop("_name_ts")
    once = nodes.filter(~renamed).with_columns(pl.lit(None, pl.String).alias("name"))
    return pl.concat([once, timed]).with_columns(pl.coalesce("name", "_any").alias("name")).drop("_names", "_any")


def _ranked(rows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """`rows` (_launch, pos, `keys`) with `_rank`: the place of each among
    the rows of its launch alike in `keys`, by pos.  Found on the rows sorted
    by them, where a window over several keys costs seconds at 10^6 rows."""
    by = ["_launch", *keys]
    rows = rows.sort([*by, "pos"], nulls_last=True)
    first = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in by])
    i = pl.int_range(pl.len(), dtype=pl.Int64)
    return rows.with_columns((i - pl.when(first).then(i).forward_fill()).alias("_rank"))


def _node_of_each_kernel(cap: Capture, ran: pl.DataFrame, dev: pl.DataFrame) -> pl.DataFrame:
    """(_launch, pos, *_LENT): per device kernel of a graph launch (`dev`,
    `pos` its place by GPU start), the host node it ran (`ran`, the launch's
    nodes in capture order; as many as its device kernels).

    The k-th node of a name and shape is the k-th device kernel of them: the
    node's handle named as the launch rows are (mangled, as CUPTI names the
    kernel), its grid and block against the device's.  Where that does not
    pair every kernel of a launch (a shape the host did not read), by name
    alone; where names cannot pair them either (a node whose handle was never
    named), by place: the k-th node in capture order is the k-th kernel to
    start, right only where the graph is one chain.  Kernels alike in name
    and shape in two parallel branches are paired in start order, which may
    swap their call sites.  CUPTI's graph_node_id does not give the capture
    order: a kernel record carries the id of the exec's node, cloned from the
    graph's at instantiation (NVIDIA's cuda_graphs_trace sample maps the two
    through CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED), in an order CUPTI does not
    document."""
    host = _node_names(cap, ran.select("_launch", "pid", "ts_ns", "pos", *_KERNEL[1:7], *_LENT))
    dev = dev.select("_launch", "pos", "name", *_KERNEL[1:7])
    out = []
    for keys in _PAIRINGS:
        # null names or shapes pair nothing (a join matches no nulls): their launch goes on
        pairs = _ranked(dev, keys).join(_ranked(host, keys).select("_launch", *keys, "_rank", *_LENT),
                                        on=["_launch", *keys, "_rank"])
        whole = pairs.group_by("_launch").len("_n").join(dev.group_by("_launch").len("_k"), on="_launch").filter(
            pl.col("_n") == pl.col("_k")).select("_launch")
        out.append(pairs.join(whole, on="_launch").select("_launch", "pos", *_LENT))
        host, dev = (f.join(whole, on="_launch", how="anti") for f in (host, dev))
    return pl.concat(out)


def graph_kernel_launches(cap: Capture, columns: dict[str, pl.DataType]) -> pl.DataFrame:
    """One launch row per kernel a graph launch runs, with `columns` (the
    launch events' schema; kind `launch`, via_graph true, graph_exec the exec):
    the graph launch's time, thread, stream and call; the node's kernel and
    shape; no API time of its own (the graph launch's is not split).  A graph
    launch whose kernels were not seen is one row with func = the exec, named
    by unknown_graph_names.  A graph launch CUPTI recorded is its device
    kernels in start order, each with the handle and call site of the host
    node it ran (_node_of_each_kernel) where the host saw as many nodes."""
    ev = _graph_calls(cap)
    empty = pl.DataFrame(schema=columns)
    if ev.is_empty():
        return empty
    launches = graph_launches(cap)
    if launches.is_empty():
        return empty
    ran, unknown = _host_nodes_per_launch(cap, launches)
    unknown = unknown.with_columns(
        pl.col("exec").alias("func"), *(pl.lit(None, pl.UInt32).alias(c) for c in _KERNEL[1:8]),
        *(pl.lit(None, pl.UInt64).alias(c) for c in _KERNEL[8:]), pl.lit(0, pl.Int64).alias("pos"))
    cols = [c for c in unknown.columns if c != "_partial"]
    parts = [ran.select(cols), unknown.select(cols)]
    dev = device_graph_kernels(cap).drop_nulls("_launch")
    if dev.height:
        # the launches CUPTI saw run their device kernels: the host's node each ran lends
        # its handle and call site, only where the counts agree
        parts = [p.join(dev.select("_launch").unique(), on="_launch", how="anti") for p in parts]
        agree = ran.group_by("_launch").len("_host").join(dev.group_by("_launch").len("_dev"), on="_launch").filter(
            pl.col("_host") == pl.col("_dev")).select("_launch")
        lent = _node_of_each_kernel(cap, ran.join(agree, on="_launch"), dev.join(agree, on="_launch"))
        on_dev = launches.drop(*[c for c in _KERNEL if c in launches.columns]).join(
            dev.select("_launch", "pos", *_KERNEL[1:7]), on="_launch").join(lent, on=["_launch", "pos"], how="left")
        parts.append(on_dev.select(cols))
    rows = pl.concat(parts, how="vertical_relaxed").sort(["_launch", "pos"], maintain_order=True).with_columns(
        pl.col("exec").alias("graph_exec"), pl.lit(True).alias("via_graph"), pl.lit("launch").alias("kind"),
        pl.lit(None, pl.Int64).alias("dur_ns"), pl.lit(None, pl.Int64).alias("outer_ts_ns"))
    return rows.select([(pl.col(c) if c in rows.columns else pl.lit(None)).cast(t).alias(c)
                        for c, t in columns.items()])


def unknown_graph_names(cap: Capture) -> pl.DataFrame:
    """(pid, handle, name, reason) of the execs whose kernels were not seen:
    the name their launch rows carry, `graph@0x<exec>`."""
    ev = _graph_calls(cap)
    out = pl.DataFrame(schema={"pid": pl.UInt32, "handle": pl.UInt64, "name": pl.String, "reason": pl.String})
    if ev.is_empty():
        return out
    launches = graph_launches(cap)
    if launches.is_empty():
        return out
    partial = _partial(ev).with_columns(pl.lit(True).alias("_partial"))
    launches = launches.join(partial, on=["pid", "graph", "def_ts"], how="left")
    unknown = launches.filter(pl.col("def_ts").is_null() | pl.col("_partial").is_not_null())
    return unknown.group_by("pid", "exec").agg(pl.col("_partial").any()).select(
        pl.col("pid").cast(pl.UInt32), pl.col("exec").alias("handle"),
        pl.format("graph@{}", hex_expr(pl.col("exec"))).alias("name"),
        pl.when(pl.col("_partial")).then(pl.lit(PARTIAL_REASON)).otherwise(pl.lit(UNKNOWN_REASON)).alias("reason"),
    ).sort("pid", "handle")

