"""Every command's table, piped at 80 columns (stdout not a terminal), shows every header, name
and figure whole: nothing cut with "…", nothing folded onto a second line.

Each test runs the real CLI in a subprocess with COLUMNS=80 and stdout a pipe, parses the
box tables it printed, and compares them with what the source data says should be there:
where the data is stored (bench results, quality measurements, hosts, the seeded roofline)
the same view builds the expected table in-process from the DB and every cell must match
exactly, one line per row; where a figure changes from run to run (a timing, RAM available)
the cell must still be one whole number on the row's single line.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from strata.bench.records import record
from strata.store import open_db
from strata.store.runs import select_results
from tests.conftest import run_cli
from tests.seed_host import SEEDED_ROOFLINE, seeded_home

NARROW = {"COLUMNS": "80"}  # what rich assumes for a pipe: the width the bug showed at
WHOLE_NUMBER = re.compile(r"^(-|\?|[+-]?[\d,]+(\.\d+)?(e[+-]\d+)?( ?(%|x|GiB|MiB|KiB))?)$")


@dataclass
class Printed:
    """A box table as printed: header lines and body lines, split into cells."""

    headers: list[list[str]] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split("[│┃]", line.strip())[1:-1]]


def printed_tables(stdout: str) -> list[Printed]:
    tables: list[Printed] = []
    for line in stdout.splitlines():
        s = line.strip()
        if s.startswith(("┏", "┌")):
            tables.append(Printed())
        elif s.startswith("┃"):
            tables[-1].headers.append(_cells(s))
        elif s.startswith("│"):
            tables[-1].rows.append(_cells(s))
    return tables


def _plain(cell: object) -> str:
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell), emoji=False).plain


def expected(table: Table) -> Printed:
    """What `table` shows, cell by cell, as one line per row."""
    columns = [[_plain(c) for c in col._cells] for col in table.columns]
    return Printed([[_plain(c.header) for c in table.columns]],
                   [list(row) for row in zip(*columns, strict=True)])


def find(tables: list[Printed], headers: list[str]) -> Printed:
    """The printed table with these headers (on one line: a wrapped header fails here)."""
    match = [t for t in tables if t.headers == [headers]]
    assert match, f"no table with headers {headers} on one line: {[t.headers for t in tables]}"
    return match[0]


def assert_whole(stdout: str, want: Table) -> None:
    exp = expected(want)
    got = find(printed_tables(stdout), exp.headers[0])
    assert got.rows == exp.rows
    assert "…" not in stdout


def cli(home: Path, *args: str, timeout: float = 300) -> str:
    proc = run_cli(*args, home=home, env=NARROW, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This host and a seeded roofline (big comma-grouped figures), no measuring."""
    return seeded_home(tmp_path_factory, "tables")


@pytest.fixture(scope="module")
def long_model(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny synthetic GGUF under a long path: a name 80 columns cannot hold."""
    from strata.models.source import resolve

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        src = resolve("synthetic:tiny@q8_0").path("gguf", "llamacpp")
    dest = tmp_path_factory.mktemp("models") / "Meta-Llama-3.1-8B-Instruct-synthetic-tiny-Q8_0.gguf"
    shutil.copyfile(src, dest)
    return dest


def _conn(home: Path) -> sqlite3.Connection:
    return open_db(home / "strata.db")


def test_bench_table_piped(home: Path, long_model: Path) -> None:
    from strata.views.bench import bench_table

    stdout = cli(home, "bench", str(long_model), "-B", "llamacpp", "-p", "16", "-n", "8",
                 "-r", "2")
    conn = _conn(home)
    run_id = conn.execute("SELECT MAX(id) FROM runs").fetchone()[0]
    records = [record(r) for r in select_results(conn, "results.run_id = ?", (run_id,))]
    assert {r["model_filename"] for r in records} == {str(long_model)}
    assert_whole(stdout, bench_table(records))


def test_quality_table_piped(home: Path) -> None:
    from strata.views.quality import quality_table

    stdout = cli(home, "quality", "synthetic:tiny@f32", "-B", "llamacpp", "--ctx", "64",
                 "--max-chunks", "2")
    row = _conn(home).execute("SELECT data FROM measurements WHERE kind = 'quality' "
                              "ORDER BY id DESC LIMIT 1").fetchone()
    assert_whole(stdout, quality_table([json.loads(row[0])]))


def seed_runs(home: Path, model: str) -> tuple[int, int]:
    """Two stored bench runs of `model` with large figures (no benchmark is run)."""
    from strata.store.runs import StoredResult, add_result, finish_run, start_run

    conn = _conn(home)
    fp = conn.execute("SELECT fingerprint FROM hosts").fetchone()[0]
    runs = []
    for scale in (1.0, 1.37):
        run = start_run(conn, fp, "bench", [], {})
        for backend, test, n_prompt, n_gen, metric, base in (
                ("llamacpp", "pp512", 512, 0, "prefill_tps", 83_667.123),
                ("torch", "tg128", 0, 128, "decode_tps", 4_439_664.5)):
            samples = [base * scale + d for d in (-1.5, 0.0, 1.5)]
            add_result(conn, run, StoredResult(
                model=model, backend=backend, test=test, n_prompt=n_prompt, n_gen=n_gen,
                n_depth=0, load_config={"threads": 2}, explain=None, telemetry=None, info={},
                metrics={metric: {"mean": sum(samples) / 3, "sd": 1.5, "samples": samples}}))
        finish_run(conn, run, "complete")
        runs.append(run)
    return runs[0], runs[1]


def test_hosts_compare_and_history_tables_piped(home: Path, long_model: Path) -> None:
    from strata.compare import compare, history
    from strata.store.hosts import list_hosts
    from strata.views.compare import compare_table, history_table
    from strata.views.hosts import hosts_table

    a, b = (str(run) for run in seed_runs(home, str(long_model)))
    conn = _conn(home)
    assert_whole(cli(home, "compare", a, b), compare_table(compare(conn, a, b), a, b))
    assert_whole(cli(home, "history"), history_table(history(conn, None, None, None)))
    assert_whole(cli(home, "hosts"), hosts_table(list_hosts(conn)))


def test_probe_tables_piped(home: Path) -> None:
    from strata.hardware.probe import probe_host
    from strata.views.probe import roofline_table, software_table, verdict_table

    stdout = cli(home, "probe", "--no-smoke")
    profile = probe_host(smoke=False)
    assert_whole(stdout, roofline_table(SEEDED_ROOFLINE))  # the stored one: exact figures
    assert_whole(stdout, verdict_table(profile.verdicts))
    software = expected(software_table(profile))  # key/value, no header row
    tables = printed_tables(stdout)
    assert any(t.rows == software.rows for t in tables), tables


def test_fit_table_piped(home: Path) -> None:
    """Weights and KV are exact from the model; 'available' and 'max ctx' follow free RAM,
    so those two are checked as whole figures on the row's one line."""
    from strata.commands.fit import run_fit
    from strata.views.fit import fit_table

    model = "synthetic:llama-3.1-8b@q4_0"
    stdout = cli(home, "fit", model, "--ctx", "32768")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        report = run_fit(_conn(home), model, ctx=32768, batch=1, kv_type=None,
                         backend="llamacpp", console=Console(stderr=True))
    exp = expected(fit_table(report))
    got = find(printed_tables(stdout), exp.headers[0])
    volatile = [exp.headers[0].index(h) for h in ("available", "max ctx")]
    assert len(got.rows) == len(exp.rows)
    for g, e in zip(got.rows, exp.rows, strict=True):
        assert [c for i, c in enumerate(g) if i not in volatile] == \
            [c for i, c in enumerate(e) if i not in volatile]
        for i in volatile:
            assert WHOLE_NUMBER.match(g[i].removesuffix(" (model max)")), g[i]
    assert "…" not in stdout


def test_kernels_tables_piped(home: Path) -> None:
    from strata.kernels.dispatch import resolve
    from strata.kernels.service import list_records, session
    from strata.views.kernels import bench_table, list_table, verdict_table

    one = ("silu_mul", "--impl", "c.avx2")
    verdicts = json.loads(cli(home, "kernels", "verify", *one, "-o", "json"))
    stdout = cli(home, "kernels", "verify", *one)  # cached now: the same verdict
    got = find(printed_tables(stdout), expected(verdict_table([])).headers[0])
    assert [r[:5] for r in got.rows] == [[v["op"], v["impl"], v["device"], v["status"],
                                          str(v["cases"])] for v in verdicts]

    s = session(conn=_conn(home))
    assert_whole(cli(home, "kernels", "list"), list_table(list_records(s, None)))

    stdout = cli(home, "kernels", "bench", *one, "--shapes", "verify", "--no-compile",
                 "--max-time", "0.05")
    headers = expected(bench_table([], "")).headers[0]
    got = find(printed_tables(stdout), headers)
    impls = {r[0] for r in s.conn.execute("SELECT DISTINCT impl FROM kernel_results "
                                          "WHERE kind = 'bench'")}  # what was measured
    assert got.rows and all(r[1] in impls for r in got.rows), got.rows  # no folded line
    for row in got.rows:  # timings change per run: each must be one whole figure
        for h in ("median µs", "IQR µs", "GB/s", "% BW", "GFLOP/s", "x eager"):
            assert WHOLE_NUMBER.match(row[headers.index(h)]), (h, row)
    assert "…" not in stdout

    stdout = cli(home, "kernels", "explain", "silu_mul")
    decision = resolve("silu_mul", "cpu", s)
    lines = stdout.splitlines()
    for e in decision.trace:  # box-less table: impl, decision and why on one line
        assert any(line.startswith(e.impl) and e.reason in line for line in lines), e
    assert "…" not in stdout
