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


# llama-bench's md header for a swept setting (its printer's names), by record field
MD_SETTING = {"n_gpu_layers": "ngl", "n_threads": "threads", "n_batch": "n_batch",
              "n_ubatch": "n_ubatch", "type_k": "type_k", "type_v": "type_v",
              "flash_attn": "fa", "device": "device", "dtype": "dtype"}


def _md(records: list[Record]) -> str:
    """llama-bench's markdown: model | size | params | backend | threads | (the other swept
    settings) | test | t/s ("mean ± sd"), then strata's η, bound and n; host_busy (and the
    notes) when any result was measured on a busy host, so the mark goes where the figure
    goes."""
    settings = ["n_threads", *(n for n, _ in swept(records) if n != "n_threads")]
    rows = [{"model": r.get("model_type") or r.get("model_filename"),
             "size": _gib(r.get("model_size")), "params": _billions(r.get("model_n_params")),
             "backend": r.get("backend"),
             **{MD_SETTING[n]: setting_text(r.get(n)) for n in settings},
             "test": r.get("test"), "t/s": _mean_sd(r), "η": _eta(r.get("eta")),
             "bound": r.get("bound"), "n": r.get("n")} for r in records]
    columns = ["model", "size", "params", "backend", *(MD_SETTING[n] for n in settings),
               "test", "t/s", "η", "bound", "n"]
    if any(r.get("host_busy") for r in records):
        columns += ["host_busy", "notes"]
        for row, r in zip(rows, records, strict=True):
            row.update(host_busy=r.get("host_busy"), notes="; ".join(r.get("notes") or []))
    numeric = ("size", "params", "threads", "ngl", "n_batch", "n_ubatch", "test", "t/s", "η",
               "n")
    return md_table(rows, columns, numeric)


def _gib(n: Any) -> str:
    return "" if n is None else f"{n / 2**30:.2f} GiB"


def _billions(n: Any) -> str:
    return "" if n is None else f"{n / 1e9:.2f} B"


def _eta(x: Any) -> str:
    from strata.bench.explain import eta_text

    return "" if x is None else eta_text(x)


def _mean_sd(r: Record) -> str:
    mean, sd = r.get("avg_ts"), r.get("stddev_ts")
    if mean is None:
        return ""
    if (r.get("n") or 0) < 2 or sd is None:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {sd:.2f}" + (" !" if sd > mean else "")


def md_all(records: list[Record]) -> str:
    """A Markdown table of every field (the md of a command whose records have no layout)."""
    if not records:
        return ""
    columns = _columns(records)
    numeric = tuple(c for c in columns if any(is_number(r.get(c)) for r in records))
    return md_table(records, columns, numeric)


# -- sql: llama-bench's `-o sql` (CREATE TABLE IF NOT EXISTS, then one INSERT per record) -------

# llama-bench's own `test` columns that strata's records carry, with the types llama-bench
# declares (llama-bench.cpp's sql printer: INTEGER for its int fields, REAL for t/s, TEXT
# otherwise): strata appends to a table llama-bench created, and llama-bench to strata's.
LLAMA_BENCH_COLUMNS: dict[str, str] = {
    "build_commit": "TEXT", "build_number": "INTEGER", "cpu_info": "TEXT", "gpu_info": "TEXT",
    "backends": "TEXT", "model_filename": "TEXT", "model_type": "TEXT",
    "model_size": "INTEGER", "model_n_params": "INTEGER", "n_batch": "INTEGER",
    "n_ubatch": "INTEGER", "n_threads": "INTEGER", "type_k": "TEXT", "type_v": "TEXT",
    "n_gpu_layers": "INTEGER", "flash_attn": "INTEGER", "n_prompt": "INTEGER",
    "n_gen": "INTEGER", "n_depth": "INTEGER", "test_time": "TEXT", "avg_ns": "INTEGER",
    "stddev_ns": "INTEGER", "avg_ts": "REAL", "stddev_ts": "REAL"}
STRATA_SQL_TABLE = "strata_results"  # every field of strata's records, beside llama-bench's
_INT_SUFFIXES = ("_bytes", "_id", "_count")
_REAL_SUFFIXES = ("_ts", "_ms", "_s", "_ns", "_share", "_gbs", "_w", "_j", "_c")


def _sql_type(column: str, values: list[Any]) -> str:
    """llama-bench's type where it has the column; else the values' (INTEGER for ints and
    flags, REAL for numbers, TEXT otherwise), and where every value is null the field's
    kind by its name (a count, a figure) — never TEXT for a figure that happened to be
    absent in the first records."""
    if column in LLAMA_BENCH_COLUMNS:
        return LLAMA_BENCH_COLUMNS[column]
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool | int) for v in present):
        return "INTEGER"
    if present and all(is_number(v) for v in present):
        return "REAL"
    if present:
        return "TEXT"
    if column.startswith("n_") or column.endswith(_INT_SUFFIXES):
        return "INTEGER"
    return "REAL" if column.endswith(_REAL_SUFFIXES) or column == "eta" else "TEXT"


def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if is_number(value) or isinstance(value, bool):
        return _scalar(value)
    return "'" + _scalar(value).replace("'", "''") + "'"


def _sql_table(table: str, columns: list[str], records: list[Record]) -> list[str]:
    types = {c: _sql_type(c, [r.get(c) for r in records]) for c in columns}
    lines = [f"CREATE TABLE IF NOT EXISTS {table} ("]
    lines += [f"  {c} {types[c]}{',' if i < len(columns) - 1 else ''}"
              for i, c in enumerate(columns)]
    lines += [");", ""]
    names = ", ".join(columns)
    return lines + [f"INSERT INTO {table} ({names}) VALUES "
                    f"({', '.join(_sql_literal(r.get(c)) for c in columns)});" for r in records]


def _sql(records: list[Record]) -> str:
    """llama-bench's `-o sql`: its columns into its table `test` (created as llama-bench
    creates it, or appended to one llama-bench made), and every strata field into
    `strata_results` beside it (test_time, model_filename and test join the two)."""
    if not records:
        return ""
    columns = _columns(records)
    ours = [c for c in LLAMA_BENCH_COLUMNS if c in columns]
    lines = [*_sql_table(SQL_TABLE, ours, records), "",
             *_sql_table(STRATA_SQL_TABLE, columns, records)]
    return "\n".join(lines) + "\n"


FORMATS: dict[str, Callable[[list[Record]], str]] = {
    "md": _md, "csv": _csv, "json": _json, "jsonl": _jsonl, "sql": _sql,
}
# For records that are not bench results (hosts, compare, fit, ...): md shows every field;
# sql stays with bench's records, the rows of llama-bench's `test` table.
GENERIC_FORMATS: dict[str, Callable[[list[Record]], str]] = {
    "md": md_all, "csv": _csv, "json": _json, "jsonl": _jsonl,
}
