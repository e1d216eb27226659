"""CSV files: events.csv and one <tool>.csv per tool, in one directory (see export.csv)."""

from __future__ import annotations

from ..export import csv
from ..safe_output import OutputDir
from .results import Results


class CsvReporter:
    def render(self, results: Results, out: OutputDir) -> None:
        csv.write_tables(results.cap, results.tools, out)
