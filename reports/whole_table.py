"""Print a rich table whole, whatever the width: no cell or header is ever cut to "…".

rich fits a table into the console's width, 80 columns when the output is not a terminal (CI logs,
``| tee``, ``| cat``), and cuts what does not fit. Here: not a terminal, the table is printed at its
own natural width (a log has no right edge); a terminal wide enough for the table's narrowest
layout gets it with cells wrapped, never cut; a narrower one gets the rows as plain lines, one
``header: value`` pair after another, which wrap between pairs.
"""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

# Wide enough to measure any table's natural width.
_UNBOUNDED = 10_000


def print_whole(console: Console, table: Table) -> None:
    for column in table.columns:
        column.overflow = "fold"  # NOTE: wrap what does not fit, never "…"
    natural = Measurement.get(console, console.options.update(width=_UNBOUNDED), table)
    if not console.is_terminal:
        width = console.width
        console.width = max(width, natural.maximum)
        try:
            console.print(table)
        finally:
            console.width = width
    elif natural.minimum <= console.width:
        console.print(table)  # NOTE: rich's minimum gives every cell its longest word: nothing folds mid-word
    else:
        for line in plain_lines(table):
            console.print(line, highlight=False, markup=False)


def plain_lines(table: Table) -> list[str]:
    """The table as text lines: its title, then one line per row of ``header: value`` pairs."""
    headers = [str(column.header) for column in table.columns]
    cells = [[str(cell) for cell in column.cells] for column in table.columns]
    lines = [str(table.title)] if table.title else []
    for row in zip(*cells, strict=True):
        lines.append(" | ".join(f"{header}: {value}" for header, value in zip(headers, row, strict=True)))
    return lines

