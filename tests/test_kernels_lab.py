"""Kernel lab: specs, the built-in implementations through the real sandbox, caching,
dispatch (incl. recorded probes of GPUs that are not here) and `strata.kernels.get`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from strata.kernels import get
from strata.kernels.capability import ArchRange, Device, HostCaps, RecordedHost, Requires
from strata.kernels.dispatch import FALLBACK, KERNEL, VENDOR, resolve
from strata.kernels.impl import builtin_implementations, from_source
from strata.kernels.ops import _quant
from strata.kernels.spec import all_specs
from strata.kernels.verify import VerifyContext, verify, verify_many
from strata.store.kernels import KernelResult, save_kernel_results

FIXTURES = Path(__file__).parent / "fixtures"
OPS = ("matmul", "softmax", "layernorm", "rmsnorm", "silu_mul", "rope", "attention",
       "decode_attention", "matvec_q8_0", "matvec_q4_0", "cross_entropy")


# -- specs -------------------------------------------------------------------------------------

def test_every_op_has_a_spec_with_ragged_verify_shapes() -> None:
    specs = all_specs()
    assert set(OPS) <= set(specs)
    for spec in specs.values():
        dims = [v for shape in spec.shapes["verify"] for v in shape.values()]
        assert any(v % 8 for v in dims), f"{spec.name}: no size off every block multiple"
        assert spec.shapes["llm"], spec.name


@pytest.mark.parametrize("op", OPS)
def test_float64_reference_agrees_with_the_vendor_path(op: str) -> None:
    """The oracle and the baseline compute the same op (else speedups compare apples/pears)."""
    spec = all_specs()[op]
    for shape in spec.shapes["verify"]:
        for seed in (0, 2):
            inputs = spec.make_inputs(shape, "float32", seed, "cpu")
            params = spec.params_for(shape)
            wide = [t.double() if t.is_floating_point() else t for t in inputs]
            ref = spec.reference(*wide, **params)
            eager = spec.vendor()(*inputs, **params)
            assert tuple(ref.shape) == spec.out_shape(shape)
            torch.testing.assert_close(eager.double(), ref.double(), atol=2e-4, rtol=2e-4)


def test_seeds_give_different_distributions() -> None:
    spec = all_specs()["softmax"]
    shape = {"rows": 4, "cols": 257}
    a, b = (spec.make_inputs(shape, "float32", s, "cpu")[0] for s in (0, 1))
    assert not torch.equal(a, b)
    assert float(b[:-1].abs().max()) <= 6.0 + 1e-6  # seed 1: uniform in ±2 (x3 scale)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_block_dequantisation_matches_the_gguf_library(kind: str) -> None:
    from gguf import GGMLQuantizationType, quants

    w = _quant.random_blocks(kind, 5, 96, seed=3)
    ours = _quant.dequantize(kind, w, 96).numpy()
    theirs = quants.dequantize(w.numpy(), GGMLQuantizationType[kind.upper()])
    np.testing.assert_allclose(ours, theirs.reshape(5, 96), rtol=0, atol=0)
    scales = w.reshape(5, 3, -1)[:, :, :2].contiguous().view(torch.float16).float()
    assert bool(((scales.abs() < 6.1e-5) & (scales != 0)).any())  # subnormal scales present


# -- implementations and capabilities -----------------------------------------------------------

def test_builtins_cover_every_op_in_c_and_triton_and_five_in_cuda() -> None:
    names = {(i.op, i.name) for i in builtin_implementations()}
    for op in OPS:
        assert {(op, "c.naive"), (op, "c.avx2"), (op, "triton")} <= names, op
    cuda_ops = {op for op, name in names if name.startswith("cuda")}
    assert {"matmul", "rmsnorm", "softmax", "decode_attention", "matvec_q8_0"} <= cuda_ops
    avx2 = next(i for i in builtin_implementations() if i.name == "c.avx2")
    assert {"avx2", "fma"} <= set(avx2.requires.isa)


def test_requirements_are_checked_against_the_host() -> None:
    caps = HostCaps(isa={"avx2", "fma"}, devices=[Device("cpu", "cpu"),
                                                  Device("cuda:0", "cuda", "sm_90")],
                    tools={"cc", "nvcc"})
    assert Requires.parse("avx2,fma").check(caps) is None
    assert "avx512f" in (Requires.parse("avx512f").check(caps) or "")
    assert Requires.parse("cuda,sm_80+").check(caps) is None
    assert "sm_100" in (Requires.parse("cuda,sm_100+").check(caps) or "")
    assert "rocm" in (Requires.parse("rocm").check(caps) or "")
    assert "triton" in (Requires(device="any", tools=("triton",)).check(caps) or "")
    assert ArchRange.parse("sm_80-90").contains("sm_86")
    assert not ArchRange.parse("sm_80-90").contains("sm_100")
    assert not ArchRange.parse("gfx1200+").contains("sm_90")


# -- the real sandbox over every built-in ----------------------------------------------------

@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory):
    """Every built-in implementation verified once in a fresh home (the landing gate: a
    kernel that is wrong, or a CUDA source that does not compile, fails the suite)."""
    import os

    from strata.kernels.service import run_verify, session
    from strata.store import open_db

    home = tmp_path_factory.mktemp("kernels-home")
    old = os.environ.get("STRATA_HOME")
    os.environ["STRATA_HOME"] = str(home)
    s = session(conn=open_db(home / "strata.db"))
    verdicts = run_verify(s, list(builtin_implementations()), force=False, timeout_s=300,
                          progress=lambda _m: None)
    yield s, verdicts, home
    if old is None:
        os.environ.pop("STRATA_HOME", None)
    else:
        os.environ["STRATA_HOME"] = old


def test_every_builtin_verifies_or_compiles_here(verified) -> None:
    s, verdicts, _ = verified
    for v in verdicts:
        missing = v.impl.requires.check(s.caps)
        if v.impl.dialect == "cuda" and "nvcc" in s.caps.tools:
            assert v.status in ("pass", "compiled"), (v.impl.key, v.reason, v.message)
        elif missing:
            assert v.status == "unavailable" and v.message == missing
        else:
            assert v.status == "pass", (v.impl.key, v.reason, v.message, v.details)
            assert v.cases >= 12 and v.device


def test_verdicts_are_cached_per_source_hash(verified, tmp_path: Path) -> None:
    s, _, _ = verified
    impl = next(i for i in builtin_implementations() if i.key == "rmsnorm/c.naive")
    ctx = VerifyContext(s.conn, s.fingerprint, s.caps)
    again = verify(impl, ctx)
    assert again.passed and again.cached
    # The same source under another name/path is the same content only if bytes match:
    # an edited copy is a new implementation and runs again.
    edited = tmp_path / "rmsnorm.edited.c"
    edited.write_text(impl.source.read_text() + "\n/* edited */\n")
    fresh = verify(from_source(edited, origin="external"), ctx)
    assert fresh.passed and not fresh.cached


def test_dispatch_on_this_cpu_uses_bench_results(verified) -> None:
    from strata.kernels.service import run_bench

    s, _, _ = verified
    impls = [i for i in builtin_implementations() if i.op == "silu_mul"]
    figures = run_bench(s, impls, None, shapes="verify", compile_=False, max_time_s=0.05,
                        progress=lambda _m: None)
    timed = {f.impl for f in figures if f.median_s}
    assert {"torch.eager", "c.naive", "c.avx2"} <= timed
    assert all(f.speedup_eager for f in figures if f.impl.startswith("c.") and f.median_s)
    triton = [f for f in figures if f.impl == "triton"]
    assert triton and all(f.note.startswith("not timed: interpreter") for f in triton)

    decision = resolve("silu_mul", "cpu", s)
    verdicts = {e.impl: e for e in decision.trace}
    assert decision.outcome in (KERNEL, VENDOR)
    assert "cuda" in verdicts and "capability missing" in verdicts["cuda"].reason
    assert "interpreter" in verdicts["triton"].reason
    chosen = [e for e in decision.trace if e.verdict == "chosen"]
    assert len(chosen) == 1
    if decision.outcome == KERNEL:
        rejected_c = [e for e in decision.trace if e.impl.startswith("c.")
                      and e.verdict == "rejected"]
        assert all(e.reason.startswith("slower") for e in rejected_c)


def test_get_returns_a_verified_kernel_that_computes_the_op(verified) -> None:
    _, _, home = verified
    choice = get("rmsnorm", db=home / "strata.db")
    assert not choice.is_fallback and choice.decision.impl is not None
    assert choice.decision.impl.dialect == "c"
    x, w = torch.randn(3, 1000), torch.randn(1000)
    out = torch.full((3, 1000), float("nan"))
    choice(out, x, w)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_nothing_verified_is_a_fallback_not_a_pass(kernel_session) -> None:
    s = kernel_session
    decision = resolve("layernorm", "cpu", s)
    assert decision.outcome == FALLBACK and decision.impl is None
    assert any("not verified" in e.reason for e in decision.trace)
    assert decision.trace[-1].verdict == "fallback"
    choice = get("layernorm", db=s.conn.execute("PRAGMA database_list").fetchone()[2])
    assert choice.is_fallback
    x, w, b = torch.randn(2, 33), torch.randn(33), torch.randn(33)
    out = torch.empty(2, 33)
    choice(out, x, w, b)
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x, (33,), w, b, 1e-5))


def test_a_kernel_wrong_at_a_served_shape_is_rejected_at_verification(verified,
                                                                      tmp_path: Path) -> None:
    """Right on the small seeded shapes, wrong on a real model's width: verification runs
    the op's serve shapes too, so it never reaches the benchmark or dispatch."""
    s, _, _ = verified
    src = tmp_path / "rmsnorm.bigwrong.c"
    shutil.copyfile(FIXTURES / "kernels" / "rmsnorm_wrong_above_2048.c", src)
    impl = from_source(src, origin="external")
    verdict = verify(impl, VerifyContext(s.conn, s.fingerprint, s.caps))
    assert verdict.status == "fail" and verdict.reason == "wrong_result", verdict.message
    cols = int(verdict.where.split("'cols': ")[1].split("}")[0])
    assert cols > 2048, verdict.where


# -- recorded probes: GPUs that are not here ----------------------------------------------------

def _recorded(name: str) -> HostCaps:
    from strata.hardware.profile import HostProfile
    from strata.hardware.support import verdict_for
    from strata.kernels.capability import host_caps

    profile = HostProfile.from_dict(json.loads((FIXTURES / "probes" / f"{name}.json")
                                               .read_text()))
    profile.verdicts = [verdict_for(g, profile.software, None) for g in profile.gpus]
    caps = host_caps(profile)
    caps.tools = {"cc", "triton", "nvcc"}
    return caps


def _store_pass(s, caps: HostCaps, op: str, name: str, device: str, speedup: float | None):
    from strata.kernels.registry import implementations

    impl = next(i for i in implementations(op) if i.name == name)
    rows = [KernelResult(op, name, impl.content_hash(), "verify", "pass", device, "float32",
                         {"ok": True, "cases": 12})]
    if speedup:
        rows.append(KernelResult(op, name, impl.content_hash(), "bench", "ok", device,
                                 "float32", {"speedup_eager": speedup},
                                 shape={"rows": 1, "cols": 4096}))
    save_kernel_results(s.conn, s.fingerprint, rows)


def test_rdna4_trace_names_the_missing_vendor_kernels_and_the_cover(kernel_session) -> None:
    """RX 9070 XT (gfx1201) on a torch 2.5/ROCm 6.2 wheel: torch has no kernels for it; a
    verified Triton kernel covers the op and dispatch says so (recorded probe)."""
    s = kernel_session
    caps = _recorded("rdna4_rx9070xt_torch25_rocm62")
    _store_pass(s, caps, "rmsnorm", "triton", "rocm:0", None)
    decision = resolve("rmsnorm", "rocm:0", RecordedHost(s.conn, s.fingerprint, caps))
    assert decision.notes and "unsupported" in decision.notes[0]
    assert decision.outcome == KERNEL and decision.impl.name == "triton"
    trace = {e.impl: e for e in decision.trace}
    assert "capability missing" in trace["cuda"].reason  # a CUDA kernel needs a cuda device
    assert "runs on cpu" in trace["c.avx2"].reason or "cpu" in trace["c.avx2"].reason
    # Without the Triton verdict nothing covers the device: a fallback, said as such.
    other = resolve("softmax", "rocm:0", RecordedHost(s.conn, s.fingerprint, caps))
    assert other.outcome == FALLBACK
    assert "no verified implementation covers it" in other.trace[-1].reason


def test_h100_picks_the_fastest_verified_and_says_why_the_others_lost(kernel_session) -> None:
    s = kernel_session
    caps = _recorded("h100_torch28_cu128")
    _store_pass(s, caps, "rmsnorm", "cuda", "cuda:0", 2.4)
    _store_pass(s, caps, "rmsnorm", "triton", "cuda:0", 1.7)
    decision = resolve("rmsnorm", "cuda:0", RecordedHost(s.conn, s.fingerprint, caps))
    assert decision.outcome == KERNEL and decision.impl.name == "cuda"
    assert decision.speedup == pytest.approx(2.4)
    trace = {e.impl: e for e in decision.trace}
    assert trace["triton"].verdict == "rejected" and "slower: 1.70x" in trace["triton"].reason
    assert not decision.notes  # the vendor stack supports an H100 on cu128
    # Slower than eager everywhere: the vendor path wins, reported as such.
    _store_pass(s, caps, "softmax", "triton", "cuda:0", 0.8)
    h100 = RecordedHost(s.conn, s.fingerprint, caps)
    assert resolve("softmax", "cuda:0", h100).outcome == VENDOR


def test_parallel_verification_keeps_the_order(kernel_session) -> None:
    s = kernel_session
    impls = [i for i in builtin_implementations() if i.op == "rope" and i.dialect == "c"]
    ctx = VerifyContext(s.conn, s.fingerprint, s.caps)
    verdicts = verify_many(impls, ctx, jobs=2)
    assert [v.impl.name for v in verdicts] == [i.name for i in impls]
    assert all(v.passed for v in verdicts)


def test_a_bound_kernel_keeps_its_tensors_alive(kernel_session) -> None:
    """The thunk holds raw data pointers: it must keep the tensors they belong to alive
    (else a caller that drops its references gets writes into freed memory)."""
    import gc

    from strata.kernels.dialects import get_dialect
    from strata.kernels.registry import find
    from strata.kernels.spec import get_spec

    spec = get_spec("silu_mul")
    kernel = get_dialect("c").load(find("silu_mul", "c.avx2"), spec, "cpu")
    a, b = torch.randn(4, 4096), torch.randn(4, 4096)
    thunk = kernel.bind(torch.full((4, 4096), float("nan")), [a.clone(), b.clone()], {})
    gc.collect()
    _ = [torch.zeros(4, 4096) for _ in range(8)]  # reuse of freed blocks would show here
    thunk()
    torch.testing.assert_close(thunk.tensors[0], torch.nn.functional.silu(a) * b)
