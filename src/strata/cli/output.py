"""What the data commands share: `-o/--format`, `--json`, `--progress`, the read-only store.

`-o json` prints the command's whole answer (a list of records; for probe and fit an
object); jsonl, csv and md print its flat records, one per line or row (docs/output.md).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from strata.errors import InputError
from strata.store.export import GENERIC_FORMATS, Record, is_number, md_table

TABLE = "table"
CHOICES = (TABLE, *GENERIC_FORMATS)  # table, md, csv, json, jsonl

FormatOption = Annotated[str | None, typer.Option(
    "--format", "-o", metavar="FORMAT", show_default=False,
    help="table|json|jsonl|csv|md")]  # fits the narrowest help column on one line
JsonOption = Annotated[bool, typer.Option("--json", help="Same as -o json.")]
ProgressOption = Annotated[bool | None, typer.Option(
    "--progress/--no-progress", show_default=False,
    help="Progress on stderr (default: a live bar on a terminal, plain lines otherwise).")]


def output_format(fmt: str | None, json_flag: bool, choices: tuple[str, ...] = CHOICES) -> str:
    """The format asked for: --json is -o json; an unknown or conflicting one is exit 2."""
    if json_flag and fmt not in (None, "json"):
        raise InputError(f"--json and --format {fmt} disagree: give one of them")
    chosen = "json" if json_flag else (fmt or TABLE).lower()
    if chosen not in choices:
        raise InputError(f"--format {fmt}: choose one of {', '.join(choices)}")
    return chosen


def with_json(fmt: str, json_flag: bool) -> str:
    """A command whose -o has its own default: --json is -o json (a conflict is exit 2)."""
    if json_flag and fmt not in ("table", "json"):
        raise InputError(f"--json and --format {fmt} disagree: give one of them")
    return "json" if json_flag else fmt


def emit(out: Console, fmt: str, records: list[Record], *,
         document: Any = None, table: Callable[[], Any] | None = None,
         md_columns: tuple[str, ...] = ()) -> None:
    """Print in `fmt`: the table view, the JSON document (when the command has one), or the
    flat records through the export registry (md: `md_columns`, else every field)."""
    if fmt == TABLE:
        if table is not None:
            table()
        return
    if fmt == "json" and document is not None:
        text = GENERIC_FORMATS["json"](document)  # type: ignore[arg-type]
    elif fmt == "md" and md_columns:
        numeric = tuple(c for c in md_columns if any(is_number(r.get(c)) for r in records))
        text = md_table(records, md_columns, numeric)
    else:
        text = GENERIC_FORMATS[fmt](records)
    out.file.write(text)
    out.file.flush()


def db_path(db: Path | None) -> Path:
    from strata.paths import default_db_path

    return Path(db or default_db_path()).expanduser()


def read_store(db: Path | None) -> sqlite3.Connection | None:
    """The results DB opened read-only, or None when it does not exist: a command that only
    reads (hosts, history, compare, fit, report) never creates a file or a folder."""
    from strata.store.db import open_db_readonly

    return open_db_readonly(db_path(db))


def no_store(db: Path | None) -> str:
    """What a read-only command says when there is no DB file (and it created none)."""
    return f"no results yet: no database at {db_path(db)} (nothing was created)"
