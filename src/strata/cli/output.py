"""What the data commands share: `-o/--format`, `--json`, `--progress`, the read-only store.

`-o json` prints the command's whole answer (a list of records; for probe and fit an
object); jsonl, csv and md print its flat records, one per line or row (docs/output.md).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated

import typer

from strata.errors import InputError
from strata.store.export import GENERIC_FORMATS
from strata.views.output import TABLE

__all__ = ["CHOICES", "TABLE", "FormatOption", "JsonOption", "ProgressOption", "db_path",
           "no_store", "output_format", "read_store", "with_json"]

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
