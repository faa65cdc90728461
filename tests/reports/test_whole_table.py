"""Tables print whole: off a terminal at their own width, on a narrow terminal as plain lines; never cut to "…"."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from reports.whole_table import print_whole

HEADERS = ("point", "ok/fail", "req/s", "out tok/s", "TTFT p50/p99", "TPOT p50", "E2E p50", "goodput", "batch")
ROWS = [("users-16", "120/0", "1.23", "110.2 ± 4.1", "1234/4567", "123", "12345", "95%", "10.5"),
        ("users-128", "1024/3", "12.30", "1110.2 ± 40.1", "12345/45678", "1234", "123456", "100%", "100.5")]


def _printed(width: int, is_terminal: bool) -> str:
    table = Table(title="servescope: measured, warm-up excluded (latencies in ms)")
    for header in HEADERS:
        table.add_column(header, justify="right")
    for row in ROWS:
        table.add_row(*row)
    out = io.StringIO()
    print_whole(Console(file=out, width=width, force_terminal=is_terminal, color_system=None), table)
    return out.getvalue()


def test_every_header_and_cell_prints_in_full_at_any_width() -> None:
    for width, is_terminal in ((80, False), (40, False), (200, True), (80, True), (40, True)):
        text = _printed(width, is_terminal)
        assert "…" not in text, (width, is_terminal)
        flat = " ".join(text.split())  # a plain line may wrap between pairs, never inside a cell
        for cell in (*HEADERS, *ROWS[0], *ROWS[1]):
            assert cell in flat, (width, is_terminal, cell)


def test_off_a_terminal_the_table_keeps_its_columns() -> None:
    text = _printed(80, is_terminal=False)
    header_line = next(line for line in text.splitlines() if "TTFT p50/p99" in line)
    assert all(h in header_line for h in HEADERS)  # one line of headers: the table was not squeezed
