"""`-B lab` planning: which verified kernel would serve each op of a model on a device (a
recorded probe of a GPU the vendor stack cannot drive included), the storage types no op
reads, the lab's fit rules, and `strata fit MODEL -B lab` through the real CLI.

No kernel is verified here: verdict rows are stored directly, as tests/test_kernels_lab.py
does for its recorded probes.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from strata.kernels.capability import HostCaps, RecordedHost
from strata.lab.plan import (
    LAYER_OPS,
    MISSING,
    NO_KERNEL,
    NO_KERNEL_TORCH,
    RUNS,
    SERVED,
    UNVERIFIED,
    coverage,
    host_coverage,
    ops_for,
)
from strata.models.source import resolve
from strata.models.spec import ModelSpec, TensorInfo
from strata.store import open_db
from strata.store.kernels import KernelResult, save_kernel_results
from tests.conftest import FIXTURES, run_cli
from tests.seed_host import seed_host
from tests.test_tables import NARROW, assert_whole

RDNA4 = "rdna4_rx9070xt_torch25_rocm62"
MODEL = "synthetic:tiny@q8_0"


def _recorded(name: str) -> HostCaps:
    """HostCaps of a recorded probe (as tests/test_kernels_lab.py builds them)."""
    from strata.hardware.profile import HostProfile
    from strata.hardware.support import verdict_for
    from strata.kernels.capability import host_caps

    profile = HostProfile.from_dict(json.loads((FIXTURES / "probes" / f"{name}.json")
                                               .read_text()))
    profile.verdicts = [verdict_for(g, profile.software, None) for g in profile.gpus]
    caps = host_caps(profile)
    caps.tools = {"cc", "triton", "nvcc"}
    return caps


@pytest.fixture
def conn(tmp_path: Path) -> sqlite3.Connection:
    return open_db(tmp_path / "strata.db")


@pytest.fixture
def rdna4(conn: sqlite3.Connection) -> tuple[str, HostCaps]:
    """(fingerprint, caps) of the recorded RX 9070 XT host, its host row stored in `conn`
    (verdict rows belong to a host)."""
    from strata.store.hosts import save_host

    caps = _recorded(RDNA4)
    assert caps.profile is not None
    return save_host(conn, caps.profile), caps


def _store(conn: sqlite3.Connection, fp: str, op: str, name: str, device: str, status: str,
           speedup: float | None = None) -> None:
    """A stored verify verdict (and a benchmark row when `speedup` is given)."""
    from strata.kernels.registry import implementations

    impl = next(i for i in implementations(op) if i.name == name)
    data = {"ok": True, "cases": 12} if status == "pass" else \
        {"failure": {"reason": "mismatch", "message": "max error 3.1 > 1e-4"}}
    rows = [KernelResult(op, name, impl.content_hash(), "verify", status, device, "float32",
                         data)]
    if speedup:
        rows.append(KernelResult(op, name, impl.content_hash(), "bench", "ok", device,
                                 "float32", {"speedup_eager": speedup},
                                 shape={"rows": 1, "cols": 4096}))
    save_kernel_results(conn, fp, rows)


def _fail_all(conn: sqlite3.Connection, fp: str, op: str, device: str) -> None:
    """Every implementation of `op` failed on `device` (whatever implementations exist by
    then): nothing verified can serve it there."""
    from strata.kernels.registry import implementations

    for impl in implementations(op):
        _store(conn, fp, op, impl.name, device, "fail")


def _tiny() -> ModelSpec:
    spec = resolve(MODEL).spec_for("gguf")
    assert spec is not None
    return spec


# -- ops of a model -----------------------------------------------------------------------------


def test_ops_follow_the_storage_types_of_the_matrices() -> None:
    ops, unread = ops_for(["Q4_0", "F32", "Q4_0", "F16"])
    assert ops == [*LAYER_OPS, "linear_f16", "linear_f32", "linear_q4_0"] and unread == []
    assert ops_for(["Q8_0", "Q6_K", "BF16", "Q3_K"]) == (
        [*LAYER_OPS, "linear_q6_K", "linear_q8_0"], ["BF16", "Q3_K"])


def test_the_loader_refuses_weights_no_op_reads() -> None:
    """`strata.lab.load` resolves the plan's ops, and refuses (one line) what the plan
    lists as unread."""
    from strata.errors import InputError
    from strata.lab.kernels import needed_ops

    assert needed_ops(["Q8_0", "F32"]) == ops_for(["Q8_0", "F32"])[0]
    with pytest.raises(InputError, match="no lab op multiplies Q3_K"):
        needed_ops(["Q8_0", "Q3_K"])


# -- a recorded GPU the vendor stack cannot drive ------------------------------------------------


def test_rdna4_names_the_triton_kernels_and_the_missing_ones(
        conn: sqlite3.Connection, rdna4: tuple[str, HostCaps]) -> None:
    """RX 9070 XT on a torch 2.5/ROCm 6.2 wheel: torch has no kernels for gfx1201. Verified
    Triton kernels serve rmsnorm and silu_mul; rope's Triton kernel has no verdict yet;
    attention_cached and linear_q8_0 have nothing verified: the model runs there once those
    exist."""
    fp, caps = rdna4
    _store(conn, fp, "rmsnorm", "triton", "rocm:0", "pass", speedup=1.3)
    _store(conn, fp, "silu_mul", "triton", "rocm:0", "pass")
    for op in ("attention_cached", "linear_q8_0"):
        _fail_all(conn, fp, op, "rocm:0")
    cov = coverage(_tiny(), "rocm:0", RecordedHost(conn, fp, caps))
    plans = {p.op: p for p in cov.ops}
    assert list(plans) == [*LAYER_OPS, "linear_q8_0"]
    assert cov.notes and "unsupported" in cov.notes[0]
    assert plans["rmsnorm"].kernel == "triton" and plans["rmsnorm"].state == SERVED
    assert "covers what the vendor stack cannot" in plans["rmsnorm"].why
    assert plans["silu_mul"].kernel == "triton" and "not benchmarked" in plans["silu_mul"].why
    assert plans["rope"].state == UNVERIFIED and plans["rope"].why.startswith("triton: not "
                                                                              "verified")
    for op in ("attention_cached", "linear_q8_0"):
        assert plans[op].state == MISSING and plans[op].kernel == NO_KERNEL  # torch can't
        # a Triton kernel that failed, or (until one is written) none that runs there
        assert "failed verification" in plans[op].why or "not rocm:0" in plans[op].why
    assert cov.missing == ["attention_cached", "linear_q8_0"] and not cov.runs
    assert cov.verdict == ("runs here once these kernels exist: attention_cached, "
                           "linear_q8_0; and once these are verified: rope")
    assert cov.to_dict()["missing"] == cov.missing
    # what `strata fit MODEL -B lab` prints for that device: op, kernel, why; then the verdict
    from strata.lab.plan import fit_sections

    rocm = fit_sections(resolve(MODEL), RecordedHost(conn, fp, caps), "f32")[1]
    assert rocm.columns == ("op", "kernel", "why") and rocm.rows[0][:2] == ("rmsnorm", "triton")
    assert rocm.lines[0].startswith("vendor stack: unsupported on rocm:0")
    assert rocm.lines[-1] == f"lab on rocm:0: {cov.verdict}"


def test_every_device_of_the_host_is_planned(conn: sqlite3.Connection,
                                             rdna4: tuple[str, HostCaps]) -> None:
    """The CPU of the same host: torch's ops still run there, so an op without a verified
    kernel is a torch fallback, not a hole."""
    both = host_coverage(_tiny(), RecordedHost(conn, *rdna4))
    assert [c.device for c in both] == ["cpu", "rocm:0"]
    assert {p.kernel for p in both[0].ops} == {NO_KERNEL_TORCH} and not both[0].notes
    assert {p.kernel for p in both[1].ops} == {NO_KERNEL} and both[1].notes


def test_the_cpu_runs_on_lab_kernels_when_every_op_is_verified(
        conn: sqlite3.Connection, rdna4: tuple[str, HostCaps]) -> None:
    fp, caps = rdna4
    for op in [*LAYER_OPS, "linear_q8_0"]:
        _store(conn, fp, op, "c.naive", "cpu", "pass")
    cov = coverage(_tiny(), "cpu", RecordedHost(conn, fp, caps))
    assert cov.runs and cov.verdict == RUNS and not cov.notes
    assert {p.kernel for p in cov.ops} == {"c.naive"}


def test_the_x8_layout_is_listed_but_never_blocks(conn: sqlite3.Connection,
                                                  rdna4: tuple[str, HostCaps]) -> None:
    """A Q4_K/Q6_K model's coverage lists the x8 ops -B lab repacks into where they serve,
    as optional rows: with only the file-layout ops verified the model runs, and the x8
    rows say they are not served (nothing verified them); once one passes, it is served."""
    from strata.lab.plan import section

    fp, caps = rdna4
    spec = _with_types(_tiny(), {"output.weight": "Q6_K", "blk.0.ffn_down.weight": "Q4_K"})
    for op in [*LAYER_OPS, "linear_q8_0", "linear_q4_K", "linear_q6_K"]:
        _store(conn, fp, op, "c.naive", "cpu", "pass")
    cov = coverage(spec, "cpu", RecordedHost(conn, fp, caps))
    assert cov.runs and cov.verdict == RUNS
    assert [p.op for p in cov.layouts] == ["linear_q4_Kx8", "linear_q6_Kx8"]
    assert all(p.state != SERVED for p in cov.layouts)
    rows = section(cov, "m").rows
    assert rows[-2][0] == "linear_q4_Kx8" and rows[-2][2].startswith("optional x8 layout")
    _store(conn, fp, "linear_q4_Kx8", "c.naive", "cpu", "pass")
    again = coverage(spec, "cpu", RecordedHost(conn, fp, caps))
    assert again.layouts[0].state == SERVED and again.layouts[0].kernel == "c.naive"
    assert again.to_dict()["layouts"][0]["op"] == "linear_q4_Kx8"


# -- storage types and architectures the lab does not read ---------------------------------------


def _with_types(spec: ModelSpec, types: dict[str, str]) -> ModelSpec:
    tensors = [TensorInfo(t.name, t.shape, types.get(t.name, t.dtype), t.nbytes)
               for t in spec.tensors]
    return replace(spec, tensors=tensors)


def test_a_q3_k_head_and_a_bf16_matrix_are_named_as_unread(
        conn: sqlite3.Connection, rdna4: tuple[str, HostCaps]) -> None:
    spec = _with_types(_tiny(), {"output.weight": "Q3_K", "blk.0.ffn_down.weight": "BF16"})
    cov = coverage(spec, "cpu", RecordedHost(conn, *rdna4))
    assert cov.unread == ["BF16", "Q3_K"] and not cov.runs
    assert [p.op for p in cov.ops] == [*LAYER_OPS, "linear_q8_0"]
    assert "a lab op reading BF16 weights, a lab op reading Q3_K weights" in cov.verdict
    assert cov.verdict.startswith("runs here once these kernels exist: ")
    assert cov.to_dict()["unread_types"] == ["BF16", "Q3_K"]


def test_an_architecture_the_lab_does_not_run_is_a_blocker(
        conn: sqlite3.Connection, rdna4: tuple[str, HostCaps]) -> None:
    cov = coverage(replace(_tiny(), arch="gemma2"), "cpu", RecordedHost(conn, *rdna4))
    assert cov.verdict.startswith("does not run on lab: ") and "not gemma2" in cov.verdict


# -- fit rules -----------------------------------------------------------------------------------


def test_fit_rules_weights_as_stored_kv_float16_whole_on_a_gpu(strata_home: Path) -> None:
    from strata.backends.descriptors.lab import UBATCH
    from strata.fit import FITS, FitOptions, fit_model
    from strata.hardware.profile import HostProfile
    from strata.lab.model import UBATCH as MODEL_UBATCH

    assert UBATCH == MODEL_UBATCH
    host = HostProfile.from_dict(json.loads((FIXTURES / "fit" / "rtx4090_24gb.json")
                                            .read_text()))
    model = resolve("synthetic:llama-3.1-8b@q4_0")
    report = fit_model(model, host, FitOptions(ctx=8192, backend="lab"))
    spec = model.spec_for("gguf")
    gpu = report.row("cuda:0")
    assert gpu.verdict == FITS and gpu.placement.ngl is None  # no layer split: all or none
    assert gpu.placement.device.weights == spec.weight_bytes()  # the GGUF bytes as stored
    assert gpu.placement.device.kv == 2 * 32 * 8 * 128 * 8192 * 2  # float16 K/V (default)
    assert gpu.placement.host.buffers == max(t.nbytes for t in spec.tensors)  # staging
    assert report.model["kv_type"] == "f16"
    f32 = fit_model(model, host, FitOptions(ctx=8192, backend="lab", kv_type="f32"))
    assert f32.row("cuda:0").placement.device.kv == 2 * gpu.placement.device.kv
    # the mixes whose every type a lab op reads (q3_k_m and q2_k need Q3_K/Q2_K)
    assert [q.quant for q in report.quants] == ["f32", "f16", "q8_0", "q4_0", "q6_k", "q5_k_m",
                                                "q4_k_m"]
    assert any(r.startswith("lab buffers") for r in report.rules)


# -- the CLI ---------------------------------------------------------------------------------------


def test_fit_lab_prints_the_coverage_table_piped_at_80_columns(tmp_path: Path) -> None:
    from strata.kernels.service import session
    from strata.lab.plan import fit_sections
    from strata.views.fit import section_table

    home = tmp_path / "home"
    fp = seed_host(home)
    db = open_db(home / "strata.db")
    _store(db, fp, "rmsnorm", "c.naive", "cpu", "pass")
    proc = run_cli("fit", MODEL, "-B", "lab", home=home, env=NARROW)
    assert proc.returncode == 0, proc.stderr
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        s = session(conn=db)
        assert s.fingerprint == fp
        sections = fit_sections(resolve(MODEL), RecordedHost(db, fp, s.caps), "f16")
    cpu = sections[0]
    assert_whole(proc.stdout, section_table(cpu))  # every row on one line, nothing cut
    assert ("rmsnorm", "c.naive") in [row[:2] for row in cpu.rows]
    assert f"lab on cpu: {cpu.data['coverage']['verdict']}" in proc.stdout
    data = json.loads(run_cli("fit", MODEL, "-B", "lab", "--json", home=home).stdout)
    got = data["sections"][0]["coverage"]
    assert got["device"] == "cpu" and got["ops"][0] == {
        "op": "rmsnorm", "kernel": "c.naive", "outcome": "kernel", "state": SERVED,
        "why": "verified, not benchmarked (speed unknown; run strata kernels bench)"}


@pytest.mark.parametrize(("args", "names"), [
    ((MODEL, "-B", "lab", "--kv-type", "q4_0"), "--kv-type q4_0: choose one of f16, f32, q8_0"),
    ((MODEL, "-B", "lab", "--kv-type", "q8_0"), "blocks of 32 values, but this model's heads"),
    (("HF",), "-B lab runs GGUF files"),
])
def test_a_bad_combination_is_one_line_exit_2(args: tuple[str, ...], names: str,
                                              tmp_path: Path) -> None:
    from tests.test_fit import write_sparse_hf

    if args == ("HF",):
        folder = tmp_path / "hf-model"
        write_sparse_hf(folder, {"model_type": "llama", "hidden_size": 64,
                                 "intermediate_size": 128, "num_hidden_layers": 2,
                                 "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "vocab_size": 512, "max_position_embeddings": 2048,
                                 "tie_word_embeddings": False, "torch_dtype": "float16"})
        args = (str(folder), "-B", "lab")
    proc = run_cli("fit", *args, home=tmp_path / "home")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], proc.stderr
