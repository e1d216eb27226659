"""The cross-rank tools on a Dask cluster (docs/cluster.md).

For cluster timelines too large for one machine's Polars: the same analyses
(stragglers, straggler_ranks, hangs, collectives) with the same results,
run by Dask workers over the hive-partitioned events.  Each step is the
tools' own Polars code applied to a partition: the calls are matched to
their communicators where they lie, then shuffled by collective (comm_id,
seq) so that each collective's entries meet on one worker; only one row per
collective comes back.  Needs the `cluster` extra (dask[dataframe],
distributed):

    from distributed import Client
    from pasta_trace import dask_cluster
    results = dask_cluster.analyse("cluster.parquet", Client("tcp://scheduler:8786"))
    results["stragglers"]          # a Polars DataFrame, as tools.nccl.stragglers gives
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import urlsplit
from typing import TYPE_CHECKING, Callable

import polars as pl

from . import merge
from .errors import PastaError, UsageError
from .parquet_scan import first_line
from .tools import nccl
from .tools.common import bounds

if TYPE_CHECKING:
    import dask.dataframe as dd
    from distributed import Client

#: The tools this module runs, in the order `analyse` returns them.
TOOLS = ("stragglers", "straggler_ranks", "hangs", "collectives")
#: What the analyses read of each event (the partition columns are left out:
#: every rank's entry carries its communicator rank from communicators.parquet).
_COLUMNS = ["ts_ns", "dur_ns", "pid", "tid", "api", "kind", "ret", "communicator", "comm_id", "seq", "size",
            "nranks", "comm_rank"]
#: the schemes of a Dask scheduler another process serves (inproc:// is this process's own)
SCHEMES = ("tcp", "tls")
EXAMPLE = "tcp://scheduler:8786"
CONNECT_S = 10
#: how long a scheduler may take to have its first worker
WORKER_WAIT_S = 30.0
INSTALL_HINT = "pip install 'pasta-trace[cluster]' (dask[dataframe] and distributed)"


def _dask():
    try:
        import dask.dataframe as dd
        import distributed  # noqa: F401 (the scheduler the shuffle needs)
    except ImportError:
        raise UsageError("the cluster analyses need Dask", hint=INSTALL_HINT) from None
    return dd


def address(text: str) -> str:
    """A scheduler address as --cluster takes it (an argparse type):
    tcp:// or tls://, a host (an IPv6 one in brackets) and a port.  Anything
    else is refused here, before Dask parses it into an error of its own
    (inproc:// would even start a scheduler inside this process)."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as e:  # an unclosed [, a port out of range
        raise argparse.ArgumentTypeError(f"{text!r} is not a scheduler address ({e}): try {EXAMPLE}") from None
    if parts.scheme not in SCHEMES or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a scheduler address: try {EXAMPLE}")
    return text


def connect(address: str) -> "Client":
    """A client of the Dask scheduler at `address` (tcp://host:8786) that has
    a worker.  UsageError when nothing answers there or what answers is not
    Dask; PastaError when no worker joins it within WORKER_WAIT_S (the
    analyses would wait for one for ever)."""
    _dask()
    from distributed import Client

    try:
        client = Client(address, timeout=f"{CONNECT_S}s")
    except (OSError, TimeoutError) as e:
        raise UsageError(f"cannot reach the Dask scheduler at {address}: {first_line(e)}") from None
    except Exception as e:  # noqa: BLE001  what another server sends fails Dask's decoder in any way
        raise UsageError(f"{address} is not a Dask scheduler (its answer: {type(e).__name__}: {first_line(e)})",
                         hint=f"give the address `dask scheduler` prints, e.g. {EXAMPLE}") from None
    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT_S)
    except (OSError, TimeoutError):
        client.close()
        raise PastaError(f"the Dask scheduler at {address} has no worker (none joined in {WORKER_WAIT_S:g} s)",
                         hint=f"start one with: dask worker {address}") from None
    return client


def _polars(pdf) -> pl.LazyFrame:
    return pl.from_pandas(pdf).lazy()


def _pandas(df: pl.DataFrame):
    # Arrow-backed columns keep nulls in integer columns (comm_id, rank) as nulls
    return df.to_pandas(use_pyarrow_extension_array=True)


def _per_partition(ddf: "dd.DataFrame", fn: Callable[[pl.LazyFrame], pl.LazyFrame]) -> "dd.DataFrame":
    """`fn` (Polars, lazy) on every partition."""
    def run(pdf):
        return _pandas(fn(_polars(pdf)).collect())

    return ddf.map_partitions(run, meta=run(ddf._meta))


def _calls(timeline: Path, comms: pl.DataFrame) -> "dd.DataFrame":
    """merge.collective_calls of the whole timeline, partition by partition."""
    dd = _dask()
    events = dd.read_parquet(str(timeline / "events"), columns=_COLUMNS,
                             filters=[("kind", "in", ["collective", "p2p"])])
    return _per_partition(events, lambda ev: merge.calls_on_communicators(
        ev.rename({"comm_rank": "rank"}).with_columns(pl.col("api").cast(pl.String)), comms.lazy()))


def analyse(path: str | Path, client: "Client", tools: tuple[str, ...] = TOOLS) -> dict[str, pl.DataFrame]:
    """`tools` (of TOOLS) of the cluster timeline at `path` (a directory
    every worker can read), on `client`'s cluster; each as the tool of that
    name gives it."""
    _dask()
    timeline = Path(path)
    cap = merge.load(timeline)
    if "ranks" not in cap.cluster:
        raise UsageError(f"{timeline} is not a cluster timeline",
                         hint="make one with: pasta-trace merge DIR1 DIR2 ... -o OUT")
    comms = cap.communicators.collect()
    members = nccl.members_of(comms.lazy()).collect()
    out: dict[str, pl.DataFrame] = {}
    with client.as_current():
        calls = _calls(timeline, comms)
        if "collectives" in tools:
            parts = _per_partition(calls, nccl.per_rank).compute()
            out["collectives"] = nccl.finish_per_rank(nccl.combine_per_rank(_polars(parts)))
        entries = _per_partition(calls, lambda c: merge.entered(c).select("comm_id", "seq", "api", "rank", "pid",
                                                                          "ts_ns"))
        # each collective's entries on one worker: the per-collective steps run where they meet
        by_collective = entries.shuffle(on=["comm_id", "seq"])
        if len({"stragglers", "straggler_ranks", "hangs"} & set(tools)) > 1:
            by_collective = by_collective.persist()
        if {"stragglers", "straggler_ranks"} & set(tools):
            per = _polars(_per_partition(by_collective, nccl.per_collective).compute())
            out["stragglers"] = nccl.finish_stragglers(per)
            if "straggler_ranks" in tools:
                ranks = entries[["comm_id", "rank", "pid"]].drop_duplicates().compute()
                out["straggler_ranks"] = nccl.rank_table(per, _polars(ranks).unique())
        if "hangs" in tools:
            unentered = _per_partition(by_collective, lambda e: nccl.unentered(e, members.lazy())).compute()
            out["hangs"] = nccl.finish_hangs(_polars(unentered), members.lazy(), bounds(cap)[1])
    return {name: out[name] for name in TOOLS if name in tools}
