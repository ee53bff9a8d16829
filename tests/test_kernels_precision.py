"""Built-in C kernels where float32 order of operations matters, checked in this process
against float64 (repo sources, not untrusted code: no sandbox needed).

silu_mul_backward's AVX2 kernel once computed da's factor as s + silu - silu*s: for a large
gate input (a = 511, s = 1) the sum s + silu keeps only silu's precision, and da came out
3e-5 relative off. The op's verification inputs draw a, b and dy from one distribution, where
the whole output's RMS scaled that error away; a benchmark's mix of seeds (a heavy-tailed, b
and dy normal) exposed it. Here: a large gate input with ordinary b and dy, element by
element against float64.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from strata.kernels.ops import _training  # noqa: F401  (registers the training ops)
from strata.native import DEFAULT_FLAGS, build_shared

SOURCES = Path(__file__).parents[1] / "src" / "strata" / "kernels" / "sources" / "c"


def _has_avx2() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return " avx2" in flags and " fma" in flags


@pytest.mark.skipif(not _has_avx2(), reason="needs an x86 CPU with AVX2 and FMA")
def test_silu_mul_backward_avx2_keeps_float32_precision_for_large_gate_inputs() -> None:
    lib = ctypes.CDLL(str(build_shared(SOURCES / "silu_mul_backward.avx2.c",
                                       (*DEFAULT_FLAGS, "-mavx2", "-mfma"))))
    fn = lib.strata_silu_mul_backward
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64]
    gen = torch.Generator().manual_seed(0)
    n = 8192
    a = torch.linspace(-120.0, 600.0, n)  # every sign and size, up to far beyond exp's range
    b, dy = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    out = torch.empty(2 * n)
    fn(out.data_ptr(), a.data_ptr(), b.data_ptr(), dy.data_ptr(), n)

    a64, b64, dy64 = a.double(), b.double(), dy.double()
    s = torch.sigmoid(a64)
    da = dy64 * b64 * s * (1 + a64 * (1 - s))
    db = dy64 * a64 * s
    # float32 can do ~1e-7 relative of each gradient's own scale (|dy*b|, |dy*a|)
    err_da = (out[:n].double() - da).abs() / (dy64 * b64).abs().clamp_min(1e-30)
    err_db = (out[n:].double() - db).abs() / (dy64 * a64).abs().clamp_min(1e-30)
    assert torch.isfinite(out).all()
    assert err_da.max() <= 2e-6, f"da off by {err_da.max():.1e} at a={a[err_da.argmax()]:.1f}"
    assert err_db.max() <= 2e-6, f"db off by {err_db.max():.1e} at a={a[err_db.argmax()]:.1f}"
