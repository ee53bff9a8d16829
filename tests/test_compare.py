"""`strata compare` / `strata history` on a real DB filled through the store API and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strata.compare import compare, history, parse_selector
from strata.errors import InputError
from strata.hardware.profile import CpuInfo, HostProfile, SoftwareStack
from strata.store import open_db
from strata.store.hosts import save_host
from strata.store.runs import StoredResult, add_result, finish_run, start_run
from tests.conftest import run_cli


def _result(backend: str, test: str, samples: list[float], model: str = "m") -> StoredResult:
    n_prompt, n_gen = (16, 0) if test.startswith("pp") else (0, 8)
    metric = "prefill_tps" if n_prompt else "decode_tps"
    return StoredResult(model=model, backend=backend, test=test, n_prompt=n_prompt, n_gen=n_gen,
                        n_depth=0, load_config={"threads": 2}, explain=None, telemetry=None,
                        info={}, metrics={metric: {"mean": sum(samples) / len(samples),
                                                   "sd": 0.0, "samples": samples}})


def _fill(db: Path) -> tuple[int, int]:
    conn = open_db(db)
    fp = save_host(conn, HostProfile("h", CpuInfo(arch="x86_64"), [],
                                     SoftwareStack("3", "Linux", "0")))
    runs = []
    for scale in (1.0, 1.5):
        run = start_run(conn, fp, "bench", [], {})
        for backend, base in (("llamacpp", 100.0), ("torch", 50.0)):
            add_result(conn, run, _result(backend, "tg8", [base * scale + d for d in
                                                           (-1, 0, 1, 0.5)]))
        add_result(conn, run, _result("llamacpp", "pp16", [500.0, 501.0, 499.0]))
        finish_run(conn, run, "complete")
        runs.append(run)
    return runs[0], runs[1]


def test_compare_runs_pairs_configs_and_tests_significance(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    r1, r2 = _fill(db)
    pairs = {(p.a.backend, p.a.test): p for p in compare(open_db(db), str(r1), f"run:{r2}")}
    assert set(pairs) == {("llamacpp", "tg8"), ("torch", "tg8"), ("llamacpp", "pp16")}
    tg = pairs[("llamacpp", "tg8")]
    assert tg.speedup == pytest.approx(150.125 / 100.125)
    assert tg.significant is True
    assert pairs[("llamacpp", "pp16")].speedup == pytest.approx(1.0)
    assert pairs[("llamacpp", "pp16")].significant is False  # same samples: no difference


def test_compare_backends_drops_backend_from_key(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    _fill(db)
    pairs = compare(open_db(db), "backend:torch", "backend:llamacpp")
    assert [(p.a.backend, p.b.backend, p.a.test) for p in pairs] == [("torch", "llamacpp", "tg8")]
    assert pairs[0].speedup == pytest.approx(150.125 / 75.125)  # latest results win


def test_nothing_shared_or_nothing_found_are_input_errors(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    r1, _ = _fill(db)
    conn = open_db(db)
    with pytest.raises(InputError, match="no stored results"):
        compare(conn, str(r1), "run:999")
    with pytest.raises(InputError, match="expected"):
        parse_selector("gpu:1")
    with pytest.raises(InputError, match=r"A and B are the same runs \(run:1\)"):
        compare(conn, "1", "run:1")
    fp = conn.execute("SELECT fingerprint FROM hosts").fetchone()[0]
    other = start_run(conn, fp, "bench", [], {})
    add_result(conn, other, _result("llamacpp", "tg8", [1.0, 2.0], model="other-model"))
    with pytest.raises(InputError, match="share no configuration"):
        compare(conn, str(r1), str(other))
    assert len(history(conn, "other-model", None, None)) == 1
    with pytest.raises(InputError, match="no stored bench results"):
        history(conn, "missing", None, None)


def test_cli_compare_and_history(tmp_path: Path) -> None:
    r1, r2 = _fill(tmp_path / "strata.db")
    proc = run_cli("compare", str(r1), str(r2), "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    speedups = sorted(round(p["speedup"], 2) for p in json.loads(proc.stdout))
    assert speedups == [1.0, 1.5, 1.5]  # pp16 unchanged; tg8 1.5x on both backends
    table = run_cli("compare", str(r1), str(r2), home=tmp_path)
    assert "speedup" in table.stdout and "yes" in table.stdout
    hist = run_cli("history", "--backend", "torch", home=tmp_path)
    assert hist.returncode == 0 and hist.stdout.count("torch") >= 2
    bad = run_cli("compare", "1", "run:77", home=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    empty = run_cli("history", home=tmp_path / "empty")
    assert empty.returncode == 2 and "strata bench" in empty.stderr
    as_json = run_cli("history", "-o", "json", home=tmp_path / "empty")  # like `hosts`
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == [], as_json.stderr
    assert "strata bench" in as_json.stderr


def test_backends_are_compared_like_for_like_only(tmp_path: Path) -> None:
    """A -t 64 llama.cpp run against a -t 1 torch run: listed with what differs and no
    speedup (it once printed "speedup 21.499"); a matching -t 1 pair is compared."""
    conn = open_db(tmp_path / "strata.db")
    fp = save_host(conn, HostProfile("h", CpuInfo(arch="x86_64"), [],
                                     SoftwareStack("3", "Linux", "0")))
    run = start_run(conn, fp, "bench", [], {})
    for backend, threads, tps in (("llamacpp", 64, 430.0), ("torch", 1, 20.0)):
        r = _result(backend, "tg8", [tps - 1, tps, tps + 1])
        r.info["threads"] = threads
        add_result(conn, run, r)
    [pair] = compare(conn, "backend:llamacpp", "backend:torch")
    assert pair.speedup is None and pair.p is None and pair.differs == {"threads": (64, 1)}
    proc = run_cli("compare", "backend:llamacpp", "backend:torch", "--json", home=tmp_path)
    [rec] = json.loads(proc.stdout)
    assert rec["speedup"] is None and rec["differs"] == "threads 64 vs 1", rec
    assert (rec["threads_a"], rec["threads_b"]) == (64, 1)
    table = run_cli("compare", "backend:llamacpp", "backend:torch", home=tmp_path).stdout
    assert "not like for like: threads 64 vs 1" in " ".join(table.split()), table
    assert "21.5" not in table
    r = _result("llamacpp", "tg8", [39.0, 40.0, 41.0])
    r.info["threads"] = 1
    add_result(conn, run, r)
    [pair] = compare(conn, "backend:llamacpp", "backend:torch")
    assert pair.differs is None and pair.speedup == pytest.approx(0.5)


def test_busy_and_noisy_figures_keep_their_marks_everywhere(tmp_path: Path) -> None:
    """A result measured on a busy host, with an SD above its mean: history's table marks
    both ("!", busy), its md and JSON carry host_busy; compare says which side was busy; a
    bench md export of it gains host_busy and the notes; CSV writes η as UTF-8."""
    from strata.bench.records import record
    from strata.store.export import FORMATS

    conn = open_db(tmp_path / "strata.db")
    fp = save_host(conn, HostProfile("h", CpuInfo(arch="x86_64"), [],
                                     SoftwareStack("3", "Linux", "0")))
    run = start_run(conn, fp, "bench", [], {})
    calm = _result("llamacpp", "tg8", [100.0, 101.0, 99.0])
    add_result(conn, run, calm)
    noisy = _result("llamacpp", "tg8", [10.0, 1500.0, 20.0])
    noisy.metrics["decode_tps"].update(sd=856.0, n=3)
    noisy.telemetry = {"host_load": {"busy": True, "busy_share": 0.6}}
    noisy.info["notes"] = ["η below 0.4: the host was busy"]
    run2 = start_run(conn, fp, "bench", [], {})
    add_result(conn, run2, noisy)
    table = run_cli("history", home=tmp_path).stdout
    row = next(line for line in table.splitlines() if "± 856.00 !" in line)
    assert "yes" in row, table  # the busy column
    md = run_cli("history", "-o", "md", home=tmp_path).stdout
    assert "host_busy" in md.splitlines()[0] and "| 1 |" in md
    proc = run_cli("compare", str(run), str(run2), "--json", home=tmp_path)
    [rec] = json.loads(proc.stdout)
    assert (rec["host_busy_a"], rec["host_busy_b"]) == (None, True), rec
    shown = run_cli("compare", str(run), str(run2), home=tmp_path).stdout
    assert "B on a busy host" in " ".join(shown.split()), shown
    bench_md = FORMATS["md"]([record(noisy)])
    assert "host_busy" in bench_md.splitlines()[0] and "the host was busy" in bench_md
    assert "η below 0.4" in FORMATS["csv"]([record(noisy)])  # not \u03b7
