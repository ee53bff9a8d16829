"""Any table on a terminal narrower than it: columns dropped, never figures cut.

rich fits a wide table into a narrow terminal by cropping cells ("6,915…", "synthe…"), and
a cropped figure is a wrong figure. `NarrowConsole.print` hands every table wider than the
terminal to `fit_to_width`, which rebuilds it: the columns that hold figures keep their
full width and never wrap, the text columns (names, models) may fold onto more lines, a
model path shows its file name (the full path is in -o json), and whole columns are left
out, the least useful first (DROP_FIRST, by header), until the rest fits. A line under the
table names what was left out. Pipes are never narrowed (strata prints them at full width).
"""

from __future__ import annotations

import os
import re
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

# headers, least useful first: provenance and settings before the figures a row is about
DROP_FIRST = ("llama.cpp commit", "strata commit", "commit", "host", "date", "status", "run",
              "first seen", "last seen", "ttft ms", "n", "busy", "bound", "overhead",
              "buffers", "-ngl", "ceiling t/s", "kv", "weights", "η", "backend")
FIGURE = re.compile(r"^[-+~≈]?[\d,.]+(e[-+]?\d+)?\s*(%|x|\u00d7|GiB|MiB|KiB|GB/s|t/s|ms|s)?"
                    r"(\s*(±|\(|-)\s*[\d,.()e+\- ]+)?\)?(\s*!)?$|^[-?—]$"  # ! = SD > mean
                    r"|^\d{4}-\d\d-\d\d([T ][\d:.]+([+-]\d\d:\d\d|Z)?)?$"  # a timestamp
                    r"|^[0-9a-f]{7,64}$")  # a fingerprint or commit: an id is never split
MODEL_PATH = re.compile(r"^(?:/|~|\.{1,2}/).+/([^/]+\.gguf)$")
TEXT_MIN = 10


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _header(col: Any) -> str:
    return " ".join(_plain(col.header).split()).lower()


def _is_figures(col: Any) -> bool:
    cells = [_plain(c).strip() for c in col._cells]
    return bool(cells) and all(FIGURE.match(c) or not c for c in cells)


def _need(col: Any, figures: bool) -> int:
    widths = [len(line) for c in col._cells for line in _plain(c).split("\n")]
    words = [len(w) for w in _plain(col.header).split()] or [1]
    if figures:
        return max(widths + words)
    return max(min(max(widths, default=0), TEXT_MIN), max(words))


def _short(cell: Any) -> Any:
    """A model path as its file name (the whole path is in -o json)."""
    m = MODEL_PATH.match(_plain(cell))
    return Text(m.group(1), style=cell.style if isinstance(cell, Text) else "") if m else cell


def drop_first(table: Table, *headers: str) -> Table:
    """Give `table` its own order of columns to leave out, least useful first (else
    DROP_FIRST's): the view that builds a table knows best what its reader can spare."""
    table.drop_first = tuple(h.lower() for h in headers)  # type: ignore[attr-defined]
    return table


def _drop_order(table: Table) -> list[int]:
    names = [_header(c) for c in table.columns]
    order = getattr(table, "drop_first", DROP_FIRST)
    known = [i for h in order for i, n in enumerate(names) if n == h and i > 0]
    rest = [i for i in range(len(names) - 1, 0, -1) if i not in known]  # rightmost first
    return known + rest


def fit_to_width(table: Table, width: int) -> tuple[Table, list[str]]:
    """`table` rebuilt to fit `width` columns, and the headers it left out."""
    cols = table.columns
    figures = [_is_figures(c) for c in cols]
    need = [_need(c, f) for c, f in zip(cols, figures, strict=True)]
    keep = list(range(len(cols)))
    dropped = []
    for i in _drop_order(table):
        if sum(need[k] + 3 for k in keep) + 1 <= width:
            break
        keep.remove(i)
        dropped.append(" ".join(_plain(cols[i].header).split()))
    out = Table(title=table.title, caption=table.caption, box=table.box,
                title_justify=table.title_justify, show_header=table.show_header,
                show_lines=table.show_lines, header_style=table.header_style)
    for k in keep:
        c = cols[k]
        if figures[k]:
            out.add_column(c.header, justify=c.justify, no_wrap=True, min_width=need[k])
        else:
            out.add_column(c.header, justify=c.justify, overflow="fold")
    for r in range(table.row_count):
        out.add_row(*(_short(cols[k]._cells[r]) for k in keep))
    return out, dropped


def dropped_line(dropped: list[str]) -> str:
    return (f"narrow terminal: {', '.join(dropped)} not shown (a wider terminal or -o json "
            "has them)")


class NarrowConsole(Console):
    """A console that narrows tables wider than its terminal instead of cropping them."""

    def _natural(self, table: Table) -> int:
        """The width the table wants (rich's own measure is capped at the terminal's)."""
        from rich.measure import Measurement

        return Measurement.get(self, self.options.update_width(100_000), table).maximum

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if not self.is_terminal or os.environ.get("STRATA_NO_NARROW"):
            super().print(*objects, **kwargs)
            return
        notes = []
        shown = []
        for obj in objects:
            if isinstance(obj, Table) and self._natural(obj) > self.width:
                obj, dropped = fit_to_width(obj, self.width)
                if dropped:
                    notes.append(dropped_line(dropped))
            shown.append(obj)
        super().print(*shown, **kwargs)
        for note in notes:
            super().print(note, highlight=False, markup=False, soft_wrap=False)
