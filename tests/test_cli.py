"""The real `strata` command in a subprocess: output, storage, exit codes, bad input."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import run_cli


def test_version(tmp_path: Path) -> None:
    proc = run_cli("--version", home=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("strata 0.")


def test_probe_json_is_stored_and_listed(tmp_path: Path) -> None:
    proc = run_cli("probe", "--json", "--no-smoke", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    cpu = data["profile"]["cpu"]
    assert cpu["logical_threads"] >= 1 and cpu["arch"]
    assert data["profile"]["software"]["torch"]  # installed by the project's own setup
    assert data["roofline"] is None  # nothing measured yet, and nothing invented
    verdicts = data["profile"]["verdicts"]
    assert verdicts and verdicts[0]["device"] == "cpu"
    hosts = json.loads(run_cli("hosts", "--json", home=tmp_path).stdout)
    assert [h["fingerprint"] for h in hosts] == [data["fingerprint"]]
    assert hosts[0]["roofline_measured"] is False
    db = tmp_path / "strata.db"
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM hosts").fetchone()[0] == 1


def test_probe_table_output(tmp_path: Path) -> None:
    proc = run_cli("probe", "--no-smoke", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for heading in ("CPU", "Software", "Support verdict", "host fingerprint"):
        assert heading in proc.stdout
    assert "no roofline stored for this host" in proc.stdout


@pytest.mark.slow
def test_measure_stores_roofline_reused_later(tmp_path: Path) -> None:
    first = run_cli("probe", "--measure", "--json", "--no-smoke", "--allow-busy",
                    home=tmp_path)
    assert first.returncode == 0, first.stderr
    roof = json.loads(first.stdout)["roofline"]
    cpu = roof["devices"][0]
    assert cpu["device"] == "cpu" and cpu["peak_bandwidth_gbs"] > 0
    assert cpu["compute"]["fp32"]["value"] > 0 and cpu["ridge_points"]["fp32"] > 0
    again = json.loads(run_cli("probe", "--json", "--no-smoke", home=tmp_path).stdout)
    assert again["roofline_measured_now"] is False
    assert again["roofline"]["devices"][0]["bandwidth"] == cpu["bandwidth"]  # the stored one
    hosts = json.loads(run_cli("hosts", "--json", home=tmp_path).stdout)
    assert hosts[0]["roofline_measured"] is True


def test_probe_with_smoke_gives_cpu_verdict(tmp_path: Path) -> None:
    proc = run_cli("probe", "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    cpu_verdict = json.loads(proc.stdout)["profile"]["verdicts"][0]
    assert cpu_verdict["smoke"]["ok"] is True
    assert "float32" in cpu_verdict["smoke"]["dtypes_ok"]


def test_watch_summarises_and_stores(tmp_path: Path) -> None:
    proc = run_cli("probe", "--no-smoke", "--json", "--watch", "1", "--interval", "100",
                   home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    tele = json.loads(proc.stdout)["telemetry"]
    assert tele is not None
    n = sqlite3.connect(tmp_path / "strata.db").execute(
        "SELECT COUNT(*) FROM measurements WHERE kind = 'telemetry'").fetchone()[0]
    assert n == 1


@pytest.mark.parametrize("args,needle", [
    (("probe", "--no-such-flag"), "No such option"),
    (("probe", "--smoke-timeout", "0"), "--smoke-timeout"),
    (("probe", "--watch", "-3"), "--watch"),
    (("probe", "--interval", "1"), "--interval"),
    (("probe", "--smoke-timeout", "abc"), "--smoke-timeout"),
    (("frobnicate",), "No such command"),
])
def test_usage_errors_exit_2(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    proc = run_cli(*args, home=tmp_path)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_db_path_exits_2_and_leaves_file_alone(tmp_path: Path) -> None:
    proc = run_cli("probe", "--db", str(tmp_path), home=tmp_path)
    assert proc.returncode == 2
    assert "--db" in proc.stderr and "directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1  # one line, no traceback
    junk = tmp_path / "notes.txt"
    junk.write_text("my notes, not a database\n" * 50)
    proc = run_cli("hosts", "--db", str(junk), home=tmp_path)
    assert proc.returncode == 2 and "not a usable strata database" in proc.stderr
    assert junk.read_text() == "my notes, not a database\n" * 50


@pytest.mark.slow
def test_probe_completes_without_torch(tmp_path: Path) -> None:
    # A `torch` package that fails to import, first on the path: torch is "not installed".
    blocker = tmp_path / "block" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    proc = run_cli("probe", "--measure", "--json", "--allow-busy", home=tmp_path,
                   env={"PYTHONPATH": str(tmp_path / "block")})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["profile"]["software"]["torch"] is None
    assert "not installed" in data["profile"]["software"]["unknown"]["torch"]
    cpu_verdict = data["profile"]["verdicts"][0]
    assert cpu_verdict["status"] != "supported" and cpu_verdict["remedy"]
    cpu = data["roofline"]["devices"][0]
    assert cpu["bandwidth"]["triad"]["value"] > 0  # C STREAM needs no torch
    assert cpu["compute"] == {} and "torch not installed" in cpu["unknown"]["compute"]


@pytest.mark.parametrize("command", ["", "probe", "bench", "hosts", "compare", "history",
                                     "report", "quality", "fit", "kernels", "kernels list",
                                     "kernels verify", "kernels bench", "kernels explain",
                                     "kernels add"])
def test_every_help_renders(tmp_path: Path, command: str) -> None:
    # rich markup in help strings ("[/v1]") once crashed --help: render every page for real
    proc = run_cli(*command.split(), "--help", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: strata" in proc.stdout and "Traceback" not in proc.stderr
