"""Kernel lab on a real GPU (auto-skipped without one): every Triton and CUDA built-in
verified on the device in each declared dtype, dispatch on the device, and a bf16 matmul
benchmarked against cuBLAS (figures are printed, not asserted)."""

from __future__ import annotations

import pytest
import torch

from strata.kernels.impl import builtin_implementations

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_session(tmp_path_factory: pytest.TempPathFactory):
    import os

    from strata.kernels.service import session
    from strata.store import open_db

    home = tmp_path_factory.mktemp("kernels-gpu")
    os.environ["STRATA_HOME"] = str(home)
    return session(conn=open_db(home / "strata.db")), home


def test_triton_and_cuda_builtins_verify_on_the_device(gpu_session) -> None:
    from strata.kernels.service import run_verify

    s, _ = gpu_session
    impls = [i for i in builtin_implementations() if i.dialect in ("triton", "cuda")]
    verdicts = run_verify(s, impls, force=True, timeout_s=600, progress=print)
    failed = [(v.impl.key, v.reason, v.message, v.where) for v in verdicts
              if v.status != "pass"]
    assert not failed
    assert all(v.device and v.device.startswith("cuda") for v in verdicts)


def test_dispatch_on_the_device_computes_the_op(gpu_session) -> None:
    from strata.kernels import get

    _, home = gpu_session
    choice = get("rmsnorm", device="cuda:0", db=home / "strata.db")
    x, w = torch.randn(8, 4096, device="cuda"), torch.randn(4096, device="cuda")
    out = torch.empty_like(x)
    choice(out, x, w)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    print("rmsnorm on cuda:0 ->", choice.decision.outcome, choice.decision.chosen)


def test_bf16_matmul_bench_runs_against_cublas(gpu_session) -> None:
    from strata.kernels.registry import implementations
    from strata.kernels.service import run_bench

    s, _ = gpu_session
    impls = [i for i in implementations("matmul") if "bfloat16" in i.dtypes]
    figures = run_bench(s, impls, None, shapes="gpu", compile_=False, max_time_s=1.0,
                        progress=print, dtype="bfloat16")
    for f in figures:
        print(f.impl, f.median_s, f.speedup_eager, f.note)
    assert any(f.impl == "torch.eager" and f.median_s for f in figures)
    assert any(f.impl != "torch.eager" and f.median_s for f in figures)
