"""Machine formats for result records: md, csv, json, jsonl (a registry, one function each)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from typing import Any

from strata.bench.records import setting_text, swept

Record = dict[str, Any]
MD_LEAD = ("model_filename", "backend")  # then the swept settings, then MD_TAIL
MD_TAIL = ("test", "avg_ts", "stddev_ts", "eta", "bound", "n")


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
    """Every field of every record, swept or not (a machine reads the columns it wants)."""
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
    """llama-bench's layout: a column per setting swept in these records, by field name."""
    settings = tuple(name for name, _ in swept(records))
    counts = tuple(s for s in settings if s.startswith("n_"))  # right-aligned like t/s
    shown = [{**r, **{s: setting_text(r.get(s)) for s in settings}} for r in records]
    return md_table(shown, MD_LEAD + settings + MD_TAIL,
                    ("avg_ts", "stddev_ts", "eta", "n", *counts))


FORMATS: dict[str, Callable[[list[Record]], str]] = {
    "md": _md, "csv": _csv, "json": _json, "jsonl": _jsonl,
}
