"""llama-bench compatibility: its flags (-m, -ctk/-ctv, -r, -fa), its fields (test_time,
build_commit, cpu_info, gpu_info, backends, type_k/type_v), and probe naming the llama.cpp
inside llama-cpp-python. Real llama.cpp and torch on the tiny synthetic preset, the real CLI,
a real DB; the roofline is seeded so nothing measures it.

The tiny preset is used as f16: its head size (16) is smaller than a q8_0 block (32), so it
cannot hold a quantised V cache, and f16 weights also avoid llama.cpp's AMX path for q8_0
weights, which crashes on hosts that advertise AMX without allowing it.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from strata.backends.base import LoadConfig
from strata.bench.records import record, swept
from strata.store import open_db
from strata.store.runs import StoredResult, add_result, results_of_run, select_results, start_run
from tests.conftest import home_db, run_cli
from tests.seed_host import seeded_home

TINY = "synthetic:tiny@f16"
QUICK = ("-p", "16", "-n", "4", "-r", "1")
COMMIT = re.compile(r"[0-9a-f]{7,40}")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory, "llamabench")


def _bench(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("bench", *args, "--no-progress", home=home, timeout=300)


def _json(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def sweep(home: Path) -> tuple[list[dict[str, Any]], datetime, datetime]:
    """One llama.cpp run (CI time is short): a positional MODEL plus a -m one, a K cache type
    and two V cache types; and the time around it."""
    before = datetime.now(timezone.utc).replace(microsecond=0)
    recs = _json(_bench(home, TINY, "-m", "synthetic:tiny@f32", "-B", "llamacpp", "-ctk",
                        "q8_0", "-ctv", "f32,f16", *QUICK, "-o", "json"))
    return recs, before, datetime.now(timezone.utc)


def test_model_option_runs_after_the_positional_model(sweep: Any) -> None:
    recs, _, _ = sweep
    assert list(dict.fromkeys(r["model_filename"] for r in recs)) == [
        TINY, "synthetic:tiny@f32"]
    assert len(recs) == 2 * 2 * 2  # models x V types x (pp16, tg4)


def test_llamacpp_rows_carry_llama_bench_build_and_device_fields(sweep: Any,
                                                                 home: Path) -> None:
    import llama_cpp.llama_cpp as lc

    from strata.hardware.cpu import probe_cpu

    recs, before, after = sweep
    for r in recs:
        when = datetime.fromisoformat(r["test_time"].replace("Z", "+00:00"))
        assert r["test_time"].endswith("Z") and before <= when <= after + timedelta(seconds=1)
        assert COMMIT.fullmatch(r["build_commit"]), r["build_commit"]  # no "-dirty" suffix
        assert r["build_number"] is None  # no shipped library exports it (records' doc)
        assert r["cpu_info"] == probe_cpu().model  # ggml names the CPU as /proc/cpuinfo does
        gpu_build = bool(lc.llama_supports_gpu_offload())
        assert (r["backends"] == "CPU") != gpu_build and (r["gpu_info"] == "") != gpu_build
        assert (r["device"], r["dtype"]) == (None, None)  # torch's settings, not llama.cpp's
    # the stored row prints the same test_time as the run did
    stored = [record(s) for s in select_results(open_db(home / "strata.db"))
              if s.model == TINY]
    assert {s["test_time"] for s in stored} >= {r["test_time"] for r in recs if
                                                r["model_filename"] == TINY}


@pytest.mark.slow
def test_torch_rows_carry_their_dtype_device_and_no_llama_cpp_build(home: Path) -> None:
    from strata.hardware.cpu import probe_cpu

    recs = _json(_bench(home, TINY, "-B", "torch", "--dtype", "float32", *QUICK, "-o", "json"))
    assert len(recs) == 2
    for r in recs:
        assert (r["device"], r["dtype"], r["type_k"], r["type_v"]) == (
            "cpu", "float32", "float32", "float32")
        assert r["build_commit"] is None and r["backends"] == "CPU"
        assert r["cpu_info"] == probe_cpu().model
        assert r["n_gpu_layers"] is None and r["flash_attn"] is None  # llama.cpp-only flags


def test_ctk_and_ctv_set_k_and_v_apart_and_a_v_sweep_gets_a_column(sweep: Any,
                                                                   home: Path) -> None:
    from strata.store.export import FORMATS

    recs, _, _ = sweep
    assert sorted({(r["type_k"], r["type_v"]) for r in recs}) == [("q8_0", "f16"),
                                                                   ("q8_0", "f32")]
    assert ("type_v", "type_v") in swept(recs) and ("type_k", "type_k") not in swept(recs)
    header = FORMATS["md"](recs).splitlines()[0]
    assert "type_v" in header and "type_k" not in header
    loads = [json.loads(row["load_config"]) for row in home_db(home).execute(
        "SELECT load_config FROM results WHERE model = 'synthetic:tiny@f32'")]  # the sweep's
    assert {(lc["kv_type"], lc["kv_type_v"]) for lc in loads} == {("q8_0", "f16"),
                                                                  ("q8_0", "f32")}


def test_quantised_v_cache_without_flash_attention_names_the_flag(tmp_path: Path) -> None:
    from strata.backends.llamacpp import LlamaCppBackend
    from strata.errors import InputError
    from strata.models.source import resolve

    proc = _bench(tmp_path, TINY, "-B", "llamacpp", "-ctv", "q8_0", *QUICK)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "add -fa 1" in proc.stderr
    assert not (tmp_path / "strata.db").exists()  # refused before anything was opened
    # the backend itself says the same to an API caller, before llama.cpp fails a context
    with pytest.raises(InputError, match="add -fa 1"):
        LlamaCppBackend().load(resolve(TINY), LoadConfig(kv_type_v="q8_0"))


@pytest.mark.parametrize("args,needle", [
    (("-r", "1,2"), "-r 1,2: repetitions take one number"),
    (("-r", "2-4"), "-r 2-4"),
    (("-fa", "2"), "-fa 2"),
    (("-fa", "0,1,2"), "-fa"),
    (("--ci-target", "7"), "--ci-target 7: must be between 0 and 1"),
    (("--ci-target", "nan"), "--ci-target"),
    (("--max-time", "inf"), "--max-time inf: must be a finite number"),
    (("-ctv", "q3_k"), "-ctv q3_k"),
])
def test_out_of_range_flags_exit_2_in_one_line(tmp_path: Path, args: tuple[str, ...],
                                               needle: str) -> None:
    proc = _bench(tmp_path, TINY, *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert not (tmp_path / "strata.db").exists()


def test_rows_stored_before_ctv_read_v_as_their_k_type(home: Path) -> None:
    """Before -ctv, -ctk set both: an old row's V type is its K type, and its load config
    keys equal to a new row's of the same settings (compare pairs on it)."""
    conn = open_db(home / "strata.db")
    (fingerprint,) = conn.execute("SELECT fingerprint FROM hosts LIMIT 1").fetchone()
    run_id = start_run(conn, fingerprint, "bench", [], {})
    old = {"kv_type": "q8_0", "flash_attn": True, "batch": 2048}
    add_result(conn, run_id, StoredResult(
        model=TINY, backend="llamacpp", test="tg4", n_prompt=0, n_gen=4, n_depth=0,
        load_config=old, metrics={}, explain=None, telemetry=None, info={}))
    (back,) = results_of_run(conn, run_id)
    assert back.load_config["kv_type_v"] == "q8_0"
    rec = record(back)
    assert (rec["type_k"], rec["type_v"]) == ("q8_0", "q8_0")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rec["test_time"])


def test_probe_names_llama_cpps_own_version_and_commit(home: Path) -> None:
    from strata.backends.llamacpp import build_info
    from strata.hardware.software import llama_cpp_text, probe_software

    sw = probe_software()
    commit = build_info()["llama_cpp_commit"]
    assert commit and COMMIT.match(commit) and sw.llama_cpp_commit == commit
    assert sw.llama_cpp_version and sw.llama_cpp_version != sw.llama_cpp  # not the binding's
    assert llama_cpp_text(sw) == (f"{sw.llama_cpp_version}, commit {commit} "
                                  f"(llama-cpp-python {sw.llama_cpp})")
    proc = run_cli("probe", "--json", "--no-smoke", home=home, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stored = json.loads(proc.stdout)["profile"]["software"]
    assert (stored["llama_cpp_commit"], stored["llama_cpp_version"]) == (
        commit, sw.llama_cpp_version)


def test_sql_output_loads_into_sqlite_as_llama_bench_s_does(home: Path) -> None:
    """`strata bench -o sql | sqlite3 db`, llama-bench's way of keeping results."""
    import sqlite3

    proc = _bench(home, TINY, "-B", "llamacpp", "-ctv", "f32", "-p", "16", "-n", "none", "-r",
                  "1", "-o", "sql")
    assert proc.returncode == 0, proc.stderr[-2000:]
    db = sqlite3.connect(":memory:")
    db.executescript(proc.stdout)
    rows = db.execute("SELECT model_filename, type_k, type_v, n_prompt, build_commit, "
                      "test_time, avg_ts FROM test").fetchall()
    assert len(rows) == 1
    model, type_k, type_v, n_prompt, commit, when, avg_ts = rows[0]
    assert (model, type_k, type_v, n_prompt) == (TINY, "f16", "f32", 16)
    assert COMMIT.fullmatch(commit) and when.endswith("Z") and avg_ts > 0


@pytest.mark.parametrize("args", [("-nkvo", "1"), ("--mmap", "0"), ("-sm", "row"),
                                  ("-ts", "3/1"), ("--numa", "distribute"), ("-C", "0x3")])
def test_llama_bench_only_flags_are_refused_by_name(tmp_path: Path,
                                                    args: tuple[str, ...]) -> None:
    """Not a misparse (-nkvo once read as -n kvo): the flag, 'not supported', why."""
    proc = run_cli("bench", "synthetic:tiny", *args, home=tmp_path, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert args[0] in lines[0] and "a llama-bench option not supported by strata" in lines[0]
    assert not (tmp_path / "strata.db").exists()  # refused before anything ran


def test_md_is_llama_benchs_layout() -> None:
    """model | size | params | backend | threads | test | t/s with "mean ± sd", as
    llama-bench's markdown printer writes them (GiB and B with two decimals), strata's η,
    bound and n after."""
    from strata.store.export import FORMATS

    rec = {"model_type": "llama 1B Q4_K - Medium", "model_size": 807_690_240,
           "model_n_params": 1_235_814_400, "backend": "llamacpp", "n_threads": 2,
           "test": "pp512", "avg_ts": 120.304, "stddev_ts": 1.196, "n": 3, "eta": 0.4123,
           "bound": "compute"}
    head, rule, row = FORMATS["md"]([rec]).splitlines()
    assert head == "| model | size | params | backend | threads | test | t/s | η | bound | n |"
    assert row == ("| llama 1B Q4_K - Medium | 0.75 GiB | 1.24 B | llamacpp | 2 | pp512 | "
                   "120.30 ± 1.20 | 0.41 | compute | 3 |")
    assert rule.startswith("| --- | ---: | ---: | --- | ---: |")


# llama-bench's own `CREATE TABLE test` (llama-bench.cpp's sql printer, its field list)
LLAMA_BENCH_TABLE = """CREATE TABLE IF NOT EXISTS test (
  build_commit TEXT, build_number INTEGER, cpu_info TEXT, gpu_info TEXT, backends TEXT,
  model_filename TEXT, model_type TEXT, model_size INTEGER, model_n_params INTEGER,
  n_batch INTEGER, n_ubatch INTEGER, n_threads INTEGER, cpu_mask TEXT, cpu_strict INTEGER,
  poll INTEGER, type_k TEXT, type_v TEXT, n_gpu_layers INTEGER, split_mode TEXT,
  main_gpu INTEGER, no_kv_offload INTEGER, flash_attn INTEGER, tensor_split TEXT,
  tensor_buft_overrides TEXT, use_mmap INTEGER, embeddings INTEGER, no_op_offload INTEGER,
  n_prompt INTEGER, n_gen INTEGER, n_depth INTEGER, test_time TEXT, avg_ns INTEGER,
  stddev_ns INTEGER, avg_ts REAL, stddev_ts REAL);
INSERT INTO test (model_filename, n_prompt, n_gen, avg_ts) VALUES ('lb.gguf', 512, 0, 99.5);
"""


def test_sql_appends_to_a_table_llama_bench_made_and_types_come_from_the_schema() -> None:
    """strata's INSERTs land in llama-bench's `test` table (its columns only), every strata
    field in `strata_results` beside it; a figure null in every record is still REAL."""
    import sqlite3

    from strata.store.export import FORMATS

    rec = {"model_filename": "s.gguf", "n_prompt": 16, "n_gen": 0, "n_depth": 0,
           "avg_ts": 120.5, "stddev_ts": 1.5, "n_threads": 2, "flash_attn": False,
           "test_time": "2026-12-06T12:00:00Z", "backend": "lab", "eta": 0.4,
           "ttft_ms": None, "test": "pp16"}
    db = sqlite3.connect(":memory:")
    db.executescript(LLAMA_BENCH_TABLE)
    db.executescript(FORMATS["sql"]([rec]))
    rows = db.execute("SELECT model_filename, avg_ts, typeof(n_threads) FROM test "
                      "ORDER BY rowid").fetchall()
    assert rows == [("lb.gguf", 99.5, "null"), ("s.gguf", 120.5, "integer")]
    ours = db.execute("SELECT backend, eta, test FROM strata_results").fetchall()
    assert ours == [("lab", 0.4, "pp16")]
    types = {row[1]: row[2] for row in db.execute("PRAGMA table_info(strata_results)")}
    assert types["ttft_ms"] == "REAL" and types["n_threads"] == "INTEGER"
