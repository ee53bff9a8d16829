"""Every command's real `-o json` output follows docs/output.md: every key it prints is
documented for that command, every documented key is printed, and each value has the
documented type. The schema is read from the document itself (its `### name` tables), never
from strata's code, so the two are checked against each other.

One real `strata bench` run (llama.cpp, a tiny synthetic model, decode only) feeds bench,
history and compare; probe, hosts, fit and quality run for real on the same seeded home.
"""

from __future__ import annotations

import csv
import io
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.seed_host import seed_host

DOC = Path(__file__).resolve().parents[1] / "docs" / "output.md"
MODEL = "synthetic:tiny@q8_0"
HEADING = re.compile(r"^###\s+(\S+)\s*$")
PIPE = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in PIPE.split(line.strip())[1:-1]]


def documented() -> dict[str, dict[str, str]]:
    """name -> {field: type} for every `### name` section whose table has field and type."""
    schemas: dict[str, dict[str, str]] = {}
    name = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        heading = HEADING.match(line)
        if heading:
            name = heading.group(1)
            continue
        cells = _cells(line) if line.startswith("|") else []
        if name is None or len(cells) < 2 or cells[0] in ("field", "---"):
            continue
        schemas.setdefault(name, {})[cells[0]] = cells[1]
    return schemas


SCHEMAS = documented()


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


TYPES = {
    "null": lambda v: v is None,
    "str": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": _is_number,
    "bool": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "list[float]": lambda v: isinstance(v, list) and all(map(_is_number, v)),
    "list[int]": lambda v: isinstance(v, list) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in v),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "list[object]": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
}


def check(record: dict[str, Any], schema: str, extra: tuple[str, ...] = ()) -> None:
    """`record` has exactly the fields of `schema` (and of `extra` schemas), typed so."""
    fields: dict[str, str] = {}
    for name in (schema, *extra):
        fields.update(SCHEMAS[name])
    assert set(record) == set(fields), (
        f"{schema}: undocumented {sorted(set(record) - set(fields))}, "
        f"documented but absent {sorted(set(fields) - set(record))}")
    for key, kind in fields.items():
        alternatives = kind.split("|")
        assert all(a in TYPES for a in alternatives), f"{schema}.{key}: unknown type {kind}"
        assert any(TYPES[a](record[key]) for a in alternatives), \
            f"{schema}.{key} = {record[key]!r} is not {kind}"


def test_the_document_has_a_table_per_command() -> None:
    for name in ("bench", "history", "compare", "hosts", "probe", "probe.records", "fit",
                 "fit.model", "fit.devices[]", "fit.predictions[]", "quality", "rank"):
        assert SCHEMAS.get(name), f"docs/output.md has no fields for {name}"
    for name, fields in SCHEMAS.items():  # every type is one the checker knows
        for key, kind in fields.items():
            assert all(a in TYPES for a in kind.split("|")), f"{name}.{key}: {kind}"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("schema-home")
    seed_host(home)
    return home


def _json(home: Path, *args: str, timeout: float = 300) -> Any:
    proc = run_cli(*args, "-o", "json", home=home, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def bench(home: Path) -> list[dict[str, Any]]:
    return _json(home, "bench", MODEL, "-B", "llamacpp", "-p", "none", "-n", "4", "-r", "2")


def test_bench_history_and_compare_follow_the_schema(home: Path,
                                                     bench: list[dict[str, Any]]) -> None:
    assert bench
    for r in bench:
        check(r, "bench")
    history = _json(home, "history")
    assert [h["avg_ts"] for h in history] == [r["avg_ts"] for r in bench]  # full precision
    for h in history:
        check(h, "history", extra=("bench",))
    run = history[0]["run_id"]
    pairs = _json(home, "compare", f"run:{run}", "backend:llamacpp")  # the same results
    assert pairs and pairs[0]["avg_ts_a"] == bench[0]["avg_ts"]
    for p in pairs:
        check(p, "compare")


def test_csv_and_sql_keep_full_precision_and_flags_as_0_1(home: Path,
                                                          bench: list[dict[str, Any]]) -> None:
    rows = list(csv.DictReader(io.StringIO(run_cli("history", "-o", "csv", home=home).stdout)))
    assert float(rows[0]["avg_ts"]) == bench[0]["avg_ts"]  # read back: the same float
    assert rows[0]["flash_attn"] in ("0", "1") and rows[0]["host_busy"] in ("0", "1", "")
    assert [float(s) for s in rows[0]["samples_ts"].split("/")] == bench[0]["samples_ts"]
    sql = run_cli("history", "-o", "sql", home=home).stdout
    assert sql.startswith("CREATE TABLE IF NOT EXISTS test (\n")
    db = sqlite3.connect(":memory:")
    db.executescript(sql)  # llama-bench's form loads as is
    got = db.execute("SELECT avg_ts, flash_attn, model_filename, typeof(n_gen) FROM test")
    assert got.fetchall() == [(r["avg_ts"], int(r["flash_attn"]), r["model_filename"],
                               "integer") for r in bench]


def test_probe_hosts_and_fit_follow_the_schema(home: Path) -> None:
    probe = _json(home, "probe", "--no-smoke")
    check(probe, "probe")
    for h in _json(home, "hosts"):
        check(h, "hosts")
    fit = _json(home, "fit", MODEL, "--ctx", "1024")
    check(fit, "fit")
    check(fit["model"], "fit.model")
    check(fit["options"], "fit.options")
    assert fit["devices"] and fit["predictions"]  # the seeded roofline predicts
    for d in fit["devices"]:
        check(d, "fit.devices[]")
    for q in fit["quantisations"]:
        check(q, "fit.quantisations[]")
    for p in fit["predictions"]:
        check(p, "fit.predictions[]")


def test_quality_follows_the_schema(home: Path) -> None:
    records = _json(home, "quality", "synthetic:tiny@q4_0", "--ref", MODEL, "-B", "torch",
                    "--ctx", "32", "--max-chunks", "1", "--no-progress")
    assert [r["backend"] for r in records] == ["torch"]
    for r in records:
        check(r, "quality")
    assert records[0]["kl"] is not None  # with --ref: the reference's figures are there
