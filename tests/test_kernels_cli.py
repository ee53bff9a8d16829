"""`strata kernels ...` through the real CLI in a subprocess, as a user runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import home_db, run_cli

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernels-cli")


def test_list_shows_every_op_and_dialect_with_availability(home: Path) -> None:
    proc = run_cli("kernels", "list", "-o", "json", home=home)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {r["op"] for r in rows} >= {"matmul", "rmsnorm", "matvec_q4_0", "cross_entropy"}
    assert {r["dialect"] for r in rows} == {"c", "triton", "cuda"}
    cuda = [r for r in rows if r["dialect"] == "cuda"]
    assert all(r["available"].startswith(("compile-check only", "no:", "cuda")) for r in cuda)
    assert all(r["verified"] == "-" for r in rows)  # nothing verified in a fresh home


def test_verify_one_impl_then_bench_then_explain(home: Path) -> None:
    proc = run_cli("kernels", "verify", "silu_mul", "--impl", "c.avx2", "-o", "json",
                   home=home)
    assert proc.returncode == 0, proc.stderr
    [verdict] = json.loads(proc.stdout)
    assert verdict["status"] == "pass" and verdict["cases"] >= 15 and not verdict["cached"]
    again = json.loads(run_cli("kernels", "verify", "silu_mul", "--impl", "c.avx2", "-o",
                               "json", home=home).stdout)
    assert again[0]["cached"]

    proc = run_cli("kernels", "bench", "silu_mul", "--impl", "c.avx2", "--shapes", "verify",
                   "--no-compile", "--max-time", "0.05", "-o", "json", home=home)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    ours = [r for r in rows if r["impl"] == "c.avx2"]
    assert len(ours) == 5 and all(r["median_us"] > 0 and r["speedup_eager"] for r in ours)
    assert all(r["gbs"] > 0 and r["frac_bw"] is not None for r in ours)  # vs the roofline
    stored = home_db(home).execute("SELECT COUNT(*) FROM kernel_results WHERE kind='bench' "
                                   "AND impl='c.avx2'").fetchone()[0]
    assert stored == 5

    proc = run_cli("kernels", "explain", "silu_mul", "--json", home=home)
    decision = json.loads(proc.stdout)
    assert decision["outcome"] in ("kernel", "vendor")
    trace = {e["impl"]: e for e in decision["trace"]}
    assert "not verified" in trace["c.naive"]["reason"]
    human = run_cli("kernels", "explain", "silu_mul", home=home)
    assert "silu_mul on cpu" in human.stdout and "c.naive" in human.stdout


def test_add_registers_an_external_kernel_and_dispatch_sees_it(home: Path,
                                                               tmp_path: Path) -> None:
    src = tmp_path / "my_rmsnorm.c"
    src.write_text((FIXTURES / "kernels" / "rmsnorm_wrong_above_2048.c").read_text()
                   .replace("c < 2048 ? w[c] : 1.0f", "w[c]"))
    proc = run_cli("kernels", "add", str(src), "--no-bench", home=home)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "c.ext.my_rmsnorm" in proc.stdout and "pass" in proc.stdout
    rows = json.loads(run_cli("kernels", "list", "rmsnorm", "-o", "json", home=home).stdout)
    ext = [r for r in rows if r["impl"] == "c.ext.my_rmsnorm"]
    assert ext and ext[0]["verified"] == "pass" and ext[0]["origin"] == "external"
    src.write_text("garbage")  # the verified bytes live in a private copy
    rows = json.loads(run_cli("kernels", "list", "rmsnorm", "-o", "json", home=home).stdout)
    assert any(r["impl"] == "c.ext.my_rmsnorm" and r["verified"] == "pass" for r in rows)


@pytest.mark.parametrize(("args", "needle"), [
    (["kernels", "verify", "nosuchop"], "OP nosuchop: unknown op"),
    (["kernels", "verify", "rmsnorm", "--impl", "c.nope"], "--impl c.nope"),
    (["kernels", "verify", "--impl", "c.avx2"], "--impl needs an OP"),
    (["kernels", "bench", "rmsnorm", "--shapes", "huge"], "--shapes huge"),
    (["kernels", "bench", "rmsnorm", "--cache", "tepid"], "--cache tepid"),
    (["kernels", "bench", "rmsnorm", "--max-time", "0"], "--max-time"),
    (["kernels", "list", "-o", "xml"], "--format xml"),
    # sql is llama-bench's `test` table, bench's and history's alone
    (["kernels", "list", "-o", "sql"], "--format sql: choose one of table, md, csv, json, jsonl"),
    (["kernels", "attempts", "-o", "sql"], "--format sql"),
    (["kernels", "explain", "rmsnorm", "--device", "cuda:3"], "--device cuda:3"),
    (["kernels", "add", "/no/such/kernel.c"], "not found"),
])
def test_bad_input_is_one_line_and_exit_2(home: Path, args: list[str], needle: str) -> None:
    proc = run_cli(*args, home=home)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_add_without_declaration_or_with_unknown_dialect(home: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.c"
    bare.write_text("void f(void) {}\n")
    proc = run_cli("kernels", "add", str(bare), home=home)
    assert proc.returncode == 2 and "no 'strata-kernel:" in proc.stderr
    odd = tmp_path / "odd.c"
    odd.write_text("// strata-kernel: op=rmsnorm dialect=fortran\n")
    proc = run_cli("kernels", "add", str(odd), home=home)
    assert proc.returncode == 2 and "unknown dialect 'fortran'" in proc.stderr
