"""The test tree itself: pytest imports test files by their basename (the
test directories are not packages), so two files of one name in tests/unit
and tests/live stop the whole suite at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_basename() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if ".venv" not in p.parts)
    assert [n for n, k in names.items() if k > 1] == []
