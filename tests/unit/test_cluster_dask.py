"""The cross-rank tools on Dask (a LocalCluster of two workers) give what
they give on Polars, on the two-capture cluster timeline of cluster_fixtures."""

from __future__ import annotations

import pytest

pytest.importorskip("dask.dataframe", reason="dask[dataframe] (the cluster and dev extras) is not installed")
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")  # inside dask's parquet reader
distributed = pytest.importorskip("distributed", reason="distributed (the cluster and dev extras) is not installed")

from cluster_fixtures import pids, whole, write_part  # noqa: E402

from pasta_trace import dask_cluster, merge  # noqa: E402
from pasta_trace.tools import REGISTRY  # noqa: E402


@pytest.fixture(scope="module")
def timeline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dask")
    src = whole(tmp)
    p = pids(src)
    write_part(src, tmp / "a", p[:2])
    write_part(src, tmp / "b", p[2:], shift=123_456_789, host="node-b")
    out = tmp / "merged"
    merge.write_cluster([merge.load(tmp / "a"), merge.load(tmp / "b")], merge.timeline_output(out),
                        sync_ns=10_000_000)
    return out


@pytest.fixture(scope="module")
def client():
    # on TCP: --cluster takes only the address of a scheduler another process could reach
    with distributed.LocalCluster(n_workers=2, processes=False, threads_per_worker=1, dashboard_address=None,
                                  protocol="tcp", host="127.0.0.1") as lc, \
            distributed.Client(lc) as c:
        yield c


def test_dask_equals_polars(timeline, client):
    got = dask_cluster.analyse(timeline, client)
    cap = merge.load(timeline)
    assert list(got) == list(dask_cluster.TOOLS)
    for name, df in got.items():
        want = REGISTRY[name].compute(cap)
        assert want.height > 0, name
        assert df.equals(want), name
    assert got["hangs"].select("seq", "missing_ranks").rows() == [(299, "3")]


def test_not_a_cluster_timeline(tmp_path, client):
    from pasta_trace.errors import UsageError

    src = whole(tmp_path)
    with pytest.raises(UsageError, match="is not a cluster timeline"):
        dask_cluster.analyse(src, client)


def test_report_on_a_scheduler(timeline, client, capsys):
    """`report --cluster ADDR --json` prints the tables the Polars report prints."""
    import json

    from pasta_trace.cli import main

    assert main(["report", str(timeline), "--json", "--tool", "hangs", "--tool", "stragglers"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(["report", str(timeline), "--json", "--tool", "hangs", "--tool", "stragglers",
                 "--cluster", client.scheduler.address]) == 0
    assert json.loads(capsys.readouterr().out) == local
    assert main(["report", str(timeline), "--tool", "kernels", "--cluster", client.scheduler.address]) == 2
    assert capsys.readouterr().err == ("pasta-trace: error: --cluster runs stragglers, straggler_ranks, hangs, "
                                       "collectives; not kernels\n")
