"""Printing a command's answer in the format asked for: the table view, the JSON document,
or the flat records through the export registry (docs/output.md). The CLI's `-o/--format`
flag (cli/output.py) chooses `fmt`; commands call `emit`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

from strata.store.export import GENERIC_FORMATS, Record, is_number, md_table

TABLE = "table"


def emit(out: Console, fmt: str, records: list[Record], *,
         document: Any = None, table: Callable[[], Any] | None = None,
         md_columns: tuple[str, ...] = (), md_numeric: tuple[str, ...] | None = None) -> None:
    """Print in `fmt`: the table view, the JSON document (when the command has one), or the
    flat records through the export registry (md: `md_columns`, else every field). md
    right-aligns `md_numeric`, or (None) the columns that hold a number in some record."""
    if fmt == TABLE:
        if table is not None:
            table()
        return
    if fmt == "json" and document is not None:
        text = GENERIC_FORMATS["json"](document)  # type: ignore[arg-type]
    elif fmt == "md" and md_columns:
        numeric = md_numeric if md_numeric is not None else \
            tuple(c for c in md_columns if any(is_number(r.get(c)) for r in records))
        text = md_table(records, md_columns, numeric)
    else:
        text = GENERIC_FORMATS[fmt](records)
    out.file.write(text)
    out.file.flush()
