"""The tools' one table: each tool declared once with `@tool(...)` on its
compute function, and `REGISTRY` holding every declared tool once, in the
reports' order (tools.REPORT_ORDER)."""

from __future__ import annotations

import pytest

from pasta_trace.tools import REGISTRY, REPORT_ORDER, registry
from pasta_trace.tools.kernels import kernel_summary
from pasta_trace.tools.registry import PID, columns, in_order, tool


def test_registry_is_the_report_order() -> None:
    assert list(REGISTRY) == list(REPORT_ORDER)
    assert [t.name for t in REGISTRY.values()] == list(REPORT_ORDER)


def test_the_decorated_function_is_the_tool() -> None:
    kernels = REGISTRY["kernels"]
    assert kernels.compute is kernel_summary
    assert (kernels.title, kernels.reads_aggregate, kernels.needs_device) == ("Kernel summary", True, False)
    assert kernels.columns is kernel_summary.columns


def test_a_name_is_declared_once() -> None:
    with pytest.raises(ValueError, match="^tool 'kernels' registered twice$"):
        tool("kernels", "Again", columns(PID))(lambda cap: None)


def test_terminal_columns_must_be_declared() -> None:
    with pytest.raises(ValueError, match="^tool 'shown': terminal_columns not declared: nope$"):
        tool("shown", "Shown", columns(PID), terminal_columns=("pid", "nope"))(lambda cap: None)
    assert "shown" not in in_order(REPORT_ORDER)


@pytest.mark.parametrize("names, message", [
    ((*REPORT_ORDER, "nope"), "tools no such tool: nope"),
    (REPORT_ORDER[:-1], f"tools not in the order: {REPORT_ORDER[-1]}"),
    ((*REPORT_ORDER, "kernels"), "tools named twice: kernels"),
])
def test_the_order_names_every_tool_once(names: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        in_order(names)
    assert registry.in_order(REPORT_ORDER) == REGISTRY
