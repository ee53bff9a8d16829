"""`strata bench` says what its figures mean and when they mean nothing (issue 17): η, ceiling
and bound defined in --help and the README; verdicts that fit the host (no offload suspect
on a CPU) and never contradict each other; no "± 0.00" at n = 1; a result whose SD exceeds
its mean flagged; -ngl on a CPU-only llama.cpp build warned; nothing ran → exit 2; a sweep
that fails part-way prints and keeps what finished; a try that stored nothing leaves no run;
progress as one plain line per finished test when stderr is a pipe.

Real parts: the CLI in a subprocess, llama.cpp on a tiny synthetic model, a loopback server
with the standard routes generating with llama.cpp, SQLite. The roofline is seeded
(tests/seed_host.py) so no test spends time measuring one.
"""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from strata.bench.explain import explain
from strata.bench.records import record
from strata.bench.runner import spread_notes
from strata.bench.scenario import BenchTest
from strata.measure.roofline import DeviceRoofline, Figure
from strata.measure.stats import summarize
from strata.models.spec import ModelSpec, TensorInfo
from strata.store.runs import StoredResult
from strata.views.bench import bench_table
from tests.conftest import home_db, run_cli
from tests.seed_host import seeded_home

# f16: the tiny model's figures do not matter here, only what bench says about them
TINY = "synthetic:tiny@f16"
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory, "honest-home")


def _bench(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("bench", *args, home=home, timeout=300)


def _runs(home: Path) -> list[tuple[int, str, int]]:
    """(id, status, stored results) of every run in the home's DB."""
    sql = ("SELECT id, status, (SELECT COUNT(*) FROM results x WHERE x.run_id = r.id) "
           "FROM runs r ORDER BY id")
    return [tuple(row) for row in home_db(home).execute(sql).fetchall()]


# ---------------------------------------------------------------- what the figures mean

def test_help_and_readme_define_eta_ceiling_and_bound() -> None:
    proc = run_cli("bench", "--help", home=Path("/nonexistent-strata-home"),
                   env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # wrapped at 80 columns: compare words
    assert "η efficiency: measured t/s ÷ ceiling" in text
    assert "the lower of two roofs" in text
    assert "Memory: bandwidth ÷ bytes read per token" in text  # the memory roof
    assert "Compute: the peak of the arithmetic the backend runs" in text  # the compute roof
    assert "int8 dot products for quantised weights" in text
    assert "bound the roof that gives the ceiling: memory or compute" in text
    assert all(len(line) <= 80 for line in proc.stdout.splitlines())
    readme = README.read_text()
    section = readme[readme.index("### `strata bench`"):readme.index("### `strata kernels`")]
    flat = " ".join(section.split())
    for term in ("**ceiling**", "**η**", "**bound**"):
        assert term in flat, term
    assert "measured t/s ÷ ceiling" in flat and "bytes read per token" in flat
    assert "the lower of two roofs" in flat and "always consistent with `ceiling_ts`" in flat


# ---------------------------------------------------------------- verdicts

def _spec() -> ModelSpec:
    """4 layers of F16 matrices, hidden 512: 16 MiB per token."""
    d, ffn, layers, vocab = 512, 2048, 4, 1000
    tensors = [TensorInfo("token_embd.weight", (vocab, d), "F16", vocab * d * 2)]
    for i in range(layers):
        tensors += [TensorInfo(f"blk.{i}.{n}.weight", (d, d), "F16", d * d * 2)
                    for n in ("attn_q", "attn_k", "attn_v", "attn_output")]
        tensors += [TensorInfo(f"blk.{i}.{n}.weight", (ffn, d), "F16", ffn * d * 2)
                    for n in ("ffn_gate", "ffn_up", "ffn_down")]
    tensors.append(TensorInfo("output.weight", (vocab, d), "F16", vocab * d * 2))
    return ModelSpec(name="m", arch="llama", n_layers=layers, n_heads=8, n_kv_heads=8,
                     head_dim=64, hidden=d, ffn=ffn, vocab=vocab, ctx_max=2048,
                     tied_embeddings=False, tensors=tensors)


def _roof(device: str) -> DeviceRoofline:
    return DeviceRoofline(device, device, bandwidth={"triad": Figure(40.0, "m")},
                          compute={"fp32": Figure(100.0, "m")})


def test_low_eta_suspects_offload_only_where_a_gpu_was_judged() -> None:
    spec, tg = _spec(), BenchTest(0, 16)
    for device, offload in (("cpu", False), ("cuda:0", True)):
        ceiling = explain(spec, tg, _roof(device), "f16", None, {}).decode_ceiling_tps
        ex = explain(spec, tg, _roof(device), "f16", None, {"decode_tps": ceiling * 0.05})
        (low,) = ex.verdict
        assert low.startswith("decode η 0.05 < 0.4: far below the roofline — suspect")
        assert ("offload" in low) is offload, (device, low)
        assert ("too few threads" in low) is not offload


def test_a_decode_inside_the_cache_gets_one_statement_not_a_fault_beside_it() -> None:
    spec, tg, roof = _spec(), BenchTest(0, 16), _roof("cpu")
    ceiling = explain(spec, tg, roof, "f16", None, {}).decode_ceiling_tps
    cache = 1 << 30  # 16 MiB per token fit in 1 GiB
    for share, why in ((0.05, "per-token overhead, not DRAM bandwidth, bounds it"),
                       (0.7, "DRAM bandwidth does not bound it"),
                       (3.0, "served from cache, it beats the DRAM ceiling")):
        ex = explain(spec, tg, roof, "f16", None, {"decode_tps": ceiling * share}, cache)
        assert ex.cache_resident
        (only,) = ex.verdict  # one coherent statement, no "far below"/"faster than" beside it
        assert only.startswith(f"decode η {share:.2f} is measured against DRAM bandwidth")
        assert "last-level cache" in only and why in only
        assert "suspect" not in only and "faster than the roofline" not in only
    # prefill is judged against FLOP/s: the cache does not change its verdict
    pp = BenchTest(512, 0)
    pre_ceiling = explain(spec, pp, roof, "f16", None, {}).prefill_ceiling_tps
    ex = explain(spec, pp, roof, "f16", None, {"prefill_tps": pre_ceiling * 0.1}, cache)
    assert [v[:26] for v in ex.verdict] == ["prefill η 0.10 < 0.4: far "]


def _stored(samples: list[float]) -> StoredResult:
    metrics = {"decode_tps": summarize(samples).to_dict(),
               "e2e_s": summarize([1.0] * len(samples)).to_dict()}
    return StoredResult("m", "llamacpp", "tg16", 0, 16, 0, {}, metrics, None, None,
                        {"notes": spread_notes(metrics, BenchTest(0, 16))})


def _table_text(records: list[dict]) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(bench_table(records))
    return console.export_text()


def test_one_sample_shows_no_sd_and_an_sd_above_the_mean_is_flagged() -> None:
    one, steady, noisy = (record(_stored(s)) for s in ([12.5], [10.0, 10.5, 9.5],
                                                        [1.0, 1.0, 40.0]))
    assert one["n"] == 1 and not one["notes"]
    assert steady["n"] == 3 and not steady["notes"]
    assert noisy["stddev_ts"] > noisy["avg_ts"]
    (note,) = noisy["notes"]  # with the result, so JSON and every printer carry it
    assert note.startswith("SD 22.52 t/s is larger than the mean 14.00 t/s over 3 samples")
    alone = _table_text([one])
    assert "12.50" in alone and "±" not in alone  # one sample: no "± 0.00"
    table = _table_text([steady, noisy])
    assert "10.00 ± 0.50" in table and "10.00 ± 0.50 !" not in table
    assert "14.00 ± 22.52 !" in table  # the marker the note refers to


# ---------------------------------------------------------------- the CLI end to end

def test_ngl_on_a_cpu_only_build_warns_and_is_judged_on_the_cpu(home: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama.cpp build can offload: -ngl is honoured here")
    proc = _bench(home, TINY, "-B", "llamacpp", "-p", "8", "-n", "none", "-r", "1",
                  "-ngl", "99", "-o", "json", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert not re.search(r"^\[\d+/\d+\]", proc.stderr, re.M)  # --no-progress: no lines
    assert re.search(r"warning -ngl 99: this llama.cpp build cannot offload .* nothing is "
                     "offloaded", proc.stderr)
    (rec,) = json.loads(proc.stdout)
    assert rec["n_gpu_layers"] == 99
    assert any(n.startswith("-ngl 99: this llama.cpp build cannot offload") for n in
               rec["notes"])
    assert rec["eta"] is not None and rec["ceiling_ts"]  # judged against the CPU roofline
    assert not any("offload, a slow" in n for n in rec["notes"])


def test_progress_is_one_line_per_finished_test_when_piped(home: Path) -> None:
    """Piped stderr gets one line per finished test (--no-progress: none, checked above)."""
    args = (TINY, "-B", "llamacpp", "-p", "8", "-n", "2", "-r", "1", "-o", "json")
    lines = [line for line in _bench(home, *args).stderr.splitlines()
             if re.match(r"\[\d+/2\] ", line)]
    assert [line.split(" · ")[2] for line in lines] == ["pp8", "tg2"], lines
    assert all("synthetic:tiny@f16 · llamacpp" in line for line in lines)


def test_nothing_ran_exits_2_with_the_reason_and_stores_no_run(home: Path) -> None:
    from strata.models.source import resolve

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        hf_dir = resolve(TINY).path("hf", "torch")  # a Hugging Face directory
    before = _runs(home)
    proc = _bench(home, str(hf_dir), "-B", "llamacpp", "-p", "8", "-n", "none", "-r", "1")
    assert proc.returncode == 2, proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "nothing ran" in error and "needs a gguf model" in error and "-B torch" in error
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    two = _bench(home, str(hf_dir), "-B", "llamacpp,lab", "-p", "8", "-o", "json")
    assert two.returncode == 2 and two.stdout == ""  # no "[]" that reads as a success
    assert len([line for line in two.stderr.splitlines() if line.startswith("skipped ")]) == 2
    assert "error: nothing ran: all 2 model/backend pairs were skipped" in two.stderr
    assert _runs(home) == before


def test_refused_endpoint_stores_no_run(home: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = _runs(home)
    proc = _bench(home, f"http://127.0.0.1:{port}", "-p", "8", "-n", "none", "-r", "1")
    assert proc.returncode == 2 and "refused" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # the one-line error only
    assert _runs(home) == before  # no run row without results


@pytest.fixture(scope="module")
def small_server(home: Path) -> Iterator[str]:
    """Standard routes, llama.cpp behind them, a 256-token context: pp8 fits, pp512 not."""
    pytest.importorskip("httpx")
    from strata.models.source import resolve
    from tests.standard_server import standard_server

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        gguf = resolve(TINY).path("gguf", "llamacpp")
    with standard_server(gguf, n_ctx=256) as srv:
        yield srv.root


def test_endpoint_with_llamacpp_exits_2(home: Path, small_server: str) -> None:
    before = _runs(home)
    proc = _bench(home, small_server, "-B", "llamacpp", "-p", "8", "-n", "none", "-r", "1")
    assert proc.returncode == 2, proc.stderr
    assert "nothing ran" in proc.stderr and "-B openai can run it" in proc.stderr
    assert _runs(home) == before


def test_a_sweep_failing_part_way_prints_and_keeps_what_finished(home: Path,
                                                                  small_server: str) -> None:
    before = {run_id for run_id, _, _ in _runs(home)}
    proc = _bench(home, small_server, "-B", "openai", "-p", "8,512", "-n", "none", "-r", "1",
                  "-o", "json")
    assert proc.returncode == 1, proc.stderr
    (kept,) = json.loads(proc.stdout)  # the finished result, whole JSON, before the error
    assert kept["test"] == "pp8" and kept["avg_ts"] > 0
    err = proc.stderr.splitlines()
    assert err[-1].startswith("error: ") and "server closed" in err[-1]
    assert "Traceback" not in proc.stderr
    (run,) = [r for r in _runs(home) if r[0] not in before]
    assert run[1:] == ("failed", 1)  # stored, marked failed
