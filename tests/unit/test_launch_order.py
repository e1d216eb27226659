"""launch_seq: each process's launches numbered by (time, thread), and launches
alike in process, time and thread kept in the order the capture stored them."""

from __future__ import annotations

from pasta_trace import merge

from merge_fixtures import launch, write


def test_launches_of_one_ns_are_numbered_by_thread_then_stored_order(tmp_path):
    events = [
        launch(100, 10, 12, 0x1),
        launch(100, 10, 11, 0x2),  # same ns, lower thread: numbered first
        launch(100, 20, 21, 0x3),  # another process, same ns: its own numbering
        launch(50, 10, 13, 0x4),
        launch(100, 10, 11, 0x5),  # same ns and thread as 0x2: after it, as stored
        launch(100, 10, 11, 0x6),
        launch(200, 10, 11, 0x7),
    ]
    cap = merge.load(write(tmp_path / "cap", device=False, events=events))
    order = merge.launch_order(cap)
    assert order.select("pid", "tid", "ts_ns", "func", "launch_seq").rows() == [
        (10, 13, 50, 0x4, 0),
        (10, 11, 100, 0x2, 1),
        (10, 11, 100, 0x5, 2),
        (10, 11, 100, 0x6, 3),
        (10, 12, 100, 0x1, 4),
        (10, 11, 200, 0x7, 5),
        (20, 21, 100, 0x3, 0),
    ]
    assert order["_row"].to_list() == [3, 1, 4, 5, 0, 6, 2]


def test_kernel_executions_in_time_order_with_their_numbers(tmp_path):
    events = [launch(100, 10, 12, 0x1), launch(100, 10, 11, 0x2), launch(100, 20, 21, 0x3), launch(50, 10, 13, 0x4)]
    cap = merge.load(write(tmp_path / "cap", device=False, events=events))
    got = merge.kernel_executions(cap).select("pid", "tid", "ts_ns", "launch_seq", "name").collect().rows()
    assert got == [
        (10, 13, 50, 0, "unknown@0x4"),
        (10, 11, 100, 1, "unknown@0x2"),
        (10, 12, 100, 2, "unknown@0x1"),
        (20, 21, 100, 0, "unknown@0x3"),
    ]
