"""A swept setting gets a column in every table, as in llama-bench; an unswept one none.

`strata bench -t 1,2` used to print rows that differed only in t/s. These tests bench the
tiny synthetic model for real (llama.cpp, the real CLI, a real DB; the roofline is seeded so
nothing measures it) and read what each printer wrote: the terminal table, md, csv, and the
HTML report's results table, which must follow the same column and ceiling rules.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest

from strata.bench.records import record, setting_text, swept
from strata.report import build_report
from strata.store import open_db
from strata.store.runs import select_results
from tests.conftest import run_cli
from tests.seed_host import seeded_home
from tests.test_tables import printed_tables

TINY = "synthetic:tiny@q8_0"
QUICK = ("-B", "llamacpp", "-p", "8", "-n", "4", "-r", "1")


def _bench(home: Path, *args: str) -> str:
    proc = run_cli("bench", TINY, *QUICK, *args, home=home, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _md_rows(md: str) -> list[dict[str, str]]:
    head, _rule, *rows = md.strip().splitlines()
    names = [c.strip() for c in head.strip("|").split("|")]
    return [dict(zip(names, (c.strip() for c in row.strip("|").split("|")), strict=True))
            for row in rows]


def _table_rows(stdout: str) -> list[dict[str, str]]:
    (table,) = printed_tables(stdout)
    return [dict(zip(table.headers[0], row, strict=True)) for row in table.rows]


def _html_rows(home: Path) -> list[dict[str, str]]:
    """The report's results table as header -> cell text, from the HTML it writes."""
    html = build_report(open_db(home / "strata.db"), planner=None).html
    section = re.search(r'<section id="results"[^>]*>(.*?)</section>', html, re.S)
    assert section, "no results section"
    heads = re.findall(r"<th>(.*?)</th>", section.group(1))
    rows = re.findall(r"<tr>(<td>.*?)</tr>", section.group(1), re.S)
    text = [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td>(.*?)</td>", r, re.S)]
            for r in rows]
    return [dict(zip(heads, cells, strict=True)) for cells in text]


@pytest.fixture(scope="module")
def swept_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory, "swept")


@pytest.fixture(scope="module")
def plain_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory, "unswept")


@pytest.mark.slow
def test_thread_sweep_has_a_threads_column_in_table_md_csv_and_html(swept_home: Path) -> None:
    table = _table_rows(_bench(swept_home, "-t", "1,2"))
    assert [(r["threads"], r["test"]) for r in table] == [
        ("1", "pp8"), ("1", "tg4"), ("2", "pp8"), ("2", "tg4")]
    md = _md_rows(_bench(swept_home, "-t", "1,2", "-o", "md"))
    assert [(r["threads"], r["test"]) for r in md] == [
        ("1", "pp8"), ("1", "tg4"), ("2", "pp8"), ("2", "tg4")]
    assert "n_batch" not in md[0] and "type_k" not in md[0]  # only what was swept
    assert all(re.fullmatch(r"[\d.]+( ± [\d.]+)?( !)?", r["t/s"]) for r in md), md
    rows = list(csv.DictReader(io.StringIO(_bench(swept_home, "-t", "1,2", "-o", "csv"))))
    assert [r["n_threads"] for r in rows] == ["1", "1", "2", "2"]
    html = _html_rows(swept_home)  # the three runs above, one column rule
    assert sorted(r["threads"] for r in html) == ["1"] * 6 + ["2"] * 6
    assert "batch" not in html[0]


@pytest.mark.slow
def test_unswept_run_has_no_setting_columns(plain_home: Path) -> None:
    table = _table_rows(_bench(plain_home))
    assert list(table[0])[:3] == ["model", "backend", "test"]
    md = _md_rows(_bench(plain_home, "-o", "md"))
    # llama-bench's columns; threads always (as llama-bench shows it for CPU backends)
    assert list(md[0])[:6] == ["model", "size", "params", "backend", "threads", "test"]
    rows = list(csv.DictReader(io.StringIO(_bench(plain_home, "-o", "csv"))))
    assert rows[0]["n_threads"]  # csv carries every field, swept or not
    assert list(_html_rows(plain_home)[0])[:3] == ["model", "backend", "test"]


@pytest.mark.slow
def test_terminal_and_html_judge_a_test_by_the_same_ceiling(swept_home: Path) -> None:
    """pp is judged against the prefill ceiling, tg (and pp+tg) against decode: the table
    and the report print the same figure for the same stored result."""
    stdout = _bench(swept_home, "-t", "2", "-b", "64,128", "-pg", "8,4")
    conn = open_db(swept_home / "strata.db")
    run_id = conn.execute("SELECT MAX(id) FROM runs").fetchone()[0]
    recs = [record(r) for r in select_results(conn, "results.run_id = ?", (run_id,))]
    want = {(str(r["n_batch"]), r["test"]): r["prefill_ceiling_ts"] if r["test"] == "pp8"
            else r["decode_ceiling_ts"] for r in recs}
    assert len(want) == 6 and all(want.values())
    table = {(r["batch"], r["test"]): r["ceiling t/s"] for r in _table_rows(stdout)}
    assert table == {k: f"{v:,.1f}" for k, v in want.items()}
    html = {(r["batch"], r["test"]): r["ceiling t/s"] for r in _html_rows(swept_home)
            if r["run"] == str(run_id)}
    assert html == table


def test_swept_ignores_absent_settings_and_prints_flags_as_llama_bench() -> None:
    """An endpoint has no thread count (None): next to llama.cpp's 8 threads that is not a
    sweep. Flash attention prints as llama-bench's 0/1."""
    mixed = [{"n_threads": 8, "flash_attn": False}, {"n_threads": None, "flash_attn": True}]
    assert swept(mixed) == [("flash_attn", "fa")]
    assert [setting_text(r["flash_attn"]) for r in mixed] == ["0", "1"]
    assert setting_text(None) == "-"
