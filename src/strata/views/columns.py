"""Tables that fit the terminal without cutting a figure.

rich fits a wide table into a narrow terminal by cropping cells ("6,915…"), and a cropped
figure is a wrong figure. `fitted_table` instead drops whole columns, lowest value first,
until the rest fits at their natural width (text columns such as names may fold onto a
second line; figures never wrap), and says which columns it left out: `-o json` has them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

TEXT_MIN = 12  # a folding text column is given at least this many characters


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "right"
    drop: int = 0  # 0: always shown; higher numbers are dropped first
    text: bool = False  # may fold onto more lines (names, model refs); figures never do


def _width(cell: object) -> int:
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return max((len(line) for line in text.split("\n")), default=0)


def _needed(col: Column, cells: list[object]) -> int:
    widest = max([_width(c) for c in cells] + [len(w) for w in col.header.split()])
    return min(widest, max(TEXT_MIN, max(len(w) for w in col.header.split()))) \
        if col.text else max(widest, len(col.header))


def fitted_table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[object]],
                 width: int) -> tuple[Table, list[str]]:
    """The table with as many columns as `width` holds, and the headers it dropped."""
    keep = list(range(len(columns)))
    need = {i: _needed(columns[i], [r[i] for r in rows]) for i in keep}

    def total() -> int:  # "│ cell " per column + the closing "│"
        return sum(need[i] + 3 for i in keep) + 1

    order = sorted((i for i in keep if columns[i].drop), key=lambda i: (-columns[i].drop, -i))
    dropped = []
    for i in order:
        if total() <= width:
            break
        keep.remove(i)
        dropped.append(columns[i].header)
    t = Table(title=title, title_justify="left")
    for i in keep:
        c = columns[i]
        if c.text:
            t.add_column(c.header, justify=c.justify, overflow="fold")  # type: ignore[arg-type]
        else:
            t.add_column(c.header, justify=c.justify, no_wrap=True,  # type: ignore[arg-type]
                         min_width=need[i])
    for r in rows:
        t.add_row(*(r[i] if isinstance(r[i], Text) else Text(str(r[i])) for i in keep))
    return t, dropped


def dropped_line(dropped: list[str]) -> str | None:
    if not dropped:
        return None
    return (f"narrow terminal: {', '.join(dropped)} not shown (a wider terminal or -o json "
            "has them)")
