"""Machine formats for result records: md, csv, json, jsonl (a registry, one function each)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from typing import Any

Record = dict[str, Any]
MD_COLUMNS = ("model_filename", "backend", "test", "avg_ts", "stddev_ts", "eta", "bound", "n")


def _json(records: list[Record]) -> str:
    return json.dumps(records, indent=2, default=str)


def _jsonl(records: list[Record]) -> str:
    return "".join(json.dumps(r, default=str) + "\n" for r in records)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ";".join(_cell(v) for v in value)
    return "" if value is None else str(value)


def _csv(records: list[Record]) -> str:
    if not records:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
    writer.writeheader()
    for r in records:
        writer.writerow({k: _cell(v) for k, v in r.items()})
    return buf.getvalue()


def md_table(records: list[Record], columns: tuple[str, ...],
             numeric: tuple[str, ...] = ()) -> str:
    """A Markdown table of `columns` (numeric ones right-aligned)."""
    head = "| " + " | ".join(columns) + " |\n"
    rule = "| " + " | ".join("---:" if c in numeric else "---" for c in columns) + " |\n"
    rows = "".join("| " + " | ".join(_cell(r.get(c)) for c in columns) + " |\n"
                   for r in records)
    return head + rule + rows


def _md(records: list[Record]) -> str:
    return md_table(records, MD_COLUMNS, ("avg_ts", "stddev_ts", "eta", "n"))


FORMATS: dict[str, Callable[[list[Record]], str]] = {
    "md": _md, "csv": _csv, "json": _json, "jsonl": _jsonl,
}
