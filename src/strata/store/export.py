"""Machine formats for flat records: md, csv, json, jsonl, sql (a registry, one function each).

One rule per value kind, whatever the command (docs/output.md):
- floats at full precision (Python's repr: the shortest text that reads back the same float),
  never rounded: `312100.5`, not `3.121e+05`;
- booleans: JSON true/false; CSV, md and SQL 0/1 (llama-bench prints its flags as 0/1);
- None: JSON null; an empty CSV/md cell; SQL NULL;
- a list of numbers (samples) in one text cell, values joined by "/" (llama-bench writes its
  one list setting, tensor_split, that way); other lists and objects as compact JSON text.
"""

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
SQL_TABLE = "test"  # llama-bench's table name, so both tools' inserts can share a database


def _json(records: list[Record]) -> str:
    return json.dumps(records, indent=2, default=str) + "\n"


def _jsonl(records: list[Record]) -> str:
    return "".join(json.dumps(r, default=str) + "\n" for r in records)


def is_number(value: Any) -> bool:
    """A JSON number that is not a flag (bool is an int in Python)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _scalar(value: Any) -> str:
    """A value as one cell: full precision, flags 0/1, absent empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list) and all(is_number(v) for v in value):
        return "/".join(_scalar(v) for v in value)
    if isinstance(value, list | dict | tuple):
        return json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def _columns(records: list[Record]) -> list[str]:
    """Every field of every record, in first-seen order (records may differ in fields)."""
    return list(dict.fromkeys(k for r in records for k in r))


def _csv(records: list[Record]) -> str:
    """Every field of every record, swept or not (a machine reads the columns it wants)."""
    if not records:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=_columns(records), lineterminator="\n")
    writer.writeheader()
    for r in records:
        writer.writerow({k: _scalar(v) for k, v in r.items()})
    return buf.getvalue()


def _md_cell(value: Any) -> str:
    return _scalar(value).replace("|", "\\|").replace("\n", " ")


def md_table(records: list[Record], columns: tuple[str, ...] | list[str],
             numeric: tuple[str, ...] = ()) -> str:
    """A Markdown table of `columns` (numeric ones right-aligned)."""
    head = "| " + " | ".join(columns) + " |\n"
    rule = "| " + " | ".join("---:" if c in numeric else "---" for c in columns) + " |\n"
    rows = "".join("| " + " | ".join(_md_cell(r.get(c)) for c in columns) + " |\n"
                   for r in records)
    return head + rule + rows


def _md(records: list[Record]) -> str:
    """llama-bench's layout: a column per setting swept in these records, by field name;
    host_busy (and the notes) when any result was measured on a busy host, so the mark
    goes wherever the figure goes."""
    settings = tuple(name for name, _ in swept(records))
    counts = tuple(s for s in settings if s.startswith("n_"))  # right-aligned like t/s
    shown = [{**r, **{s: setting_text(r.get(s)) for s in settings}} for r in records]
    busy: tuple[str, ...] = ()
    if any(r.get("host_busy") for r in records):
        busy = ("host_busy", "notes")
        shown = [{**r, "notes": "; ".join(r.get("notes") or [])} for r in shown]
    return md_table(shown, MD_LEAD + settings + MD_TAIL + busy,
                    ("avg_ts", "stddev_ts", "eta", "n", *counts))


def md_all(records: list[Record]) -> str:
    """A Markdown table of every field (the md of a command whose records have no layout)."""
    if not records:
        return ""
    columns = _columns(records)
    numeric = tuple(c for c in columns if any(is_number(r.get(c)) for r in records))
    return md_table(records, columns, numeric)


# -- sql: llama-bench's `-o sql` (CREATE TABLE IF NOT EXISTS, then one INSERT per record) -------

def _sql_type(values: list[Any]) -> str:
    """INTEGER for ints and flags, REAL for floats, TEXT for the rest (as llama-bench)."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool | int) for v in present):
        return "INTEGER"
    if present and all(is_number(v) for v in present):
        return "REAL"
    return "TEXT"


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if is_number(value) or isinstance(value, bool):
        return _scalar(value)
    return "'" + _scalar(value).replace("'", "''") + "'"


def _sql(records: list[Record]) -> str:
    if not records:
        return ""
    columns = _columns(records)
    types = {c: _sql_type([r.get(c) for r in records]) for c in columns}
    lines = [f"CREATE TABLE IF NOT EXISTS {SQL_TABLE} ("]
    lines += [f"  {c} {types[c]}{',' if i < len(columns) - 1 else ''}"
              for i, c in enumerate(columns)]
    lines += [");", ""]
    names = ", ".join(columns)
    lines += [f"INSERT INTO {SQL_TABLE} ({names}) VALUES "
              f"({', '.join(_sql_literal(r.get(c)) for c in columns)});" for r in records]
    return "\n".join(lines) + "\n"


FORMATS: dict[str, Callable[[list[Record]], str]] = {
    "md": _md, "csv": _csv, "json": _json, "jsonl": _jsonl, "sql": _sql,
}
# For records that are not bench results (hosts, compare, fit, ...): md shows every field;
# sql stays with bench's records, the rows of llama-bench's `test` table.
GENERIC_FORMATS: dict[str, Callable[[list[Record]], str]] = {
    "md": md_all, "csv": _csv, "json": _json, "jsonl": _jsonl,
}
