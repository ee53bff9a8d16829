"""`-B lab` on llama.cpp's K-quant mixes against real llama.cpp (issue "Real files").

Files: tiny-k (whole 256-value rows, 8 layers) quantised by llama.cpp's own quantizer, as the
mixes people download (Q4_K_M, Q5_K_M, Q6_K), and files that isolate one type (every other
matrix Q8_0, whose path already matches llama.cpp exactly: tests/test_backend_lab.py).

Measured (2-core EPYC, llama-cpp-python 0.3.36), and the bounds (the odd-width fallbacks
Q5_0 and Q5_1 in their own test):
  * Q6_K layers alone: KL(llama.cpp || lab) = 0 — q8_K activations, integer super-block
    dots and ggml's float32 d_x·d product reproduce ggml_vec_dot_q6_K_q8_K bit for bit.
    Bound 1e-12.
  * Q4_K layers (Q4_K_M with head and table at Q8_0): 9e-7 on the portable C built-in,
    7.7e-6 on the AVX2 one (dispatch's choice here). llama.cpp repacks Q4_K into its
    interleaved 8x8 layout at load and sums in yet another order; a float32 ulp of
    difference in a layer's output flips a q8 rounding of the next layer's input now and
    then, and the AVX2 kernel's eight-lane partial sums differ from llama.cpp's order more
    than the scalar loop does (its result is as close to the float64 oracle: 1.0e-6 vs
    0.7e-6 of the RMS on the verification shapes). Bound 2e-5.
  * Whole mixes: 4e-6 (Q4_K_M, Q5_K_M), 9e-6 (Q6_K: its token table alone costs 6e-6 —
    the lab's rows equal gguf-py's dequantisation bit for bit, llama.cpp's lookup differs
    somewhere we have not found). Bound 2e-5, and the torch backend (the same file
    dequantised, float activations) is asserted to be ≥ 4x further away: the bound tells
    ggml's numerics apart from plain float.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) not installed")

from strata.backends.base import LoadConfig
from strata.models.source import resolve
from tests.seed_host import seed_host
from tests.test_backend_lab import IDS, lab_logits, max_kl
from tests.test_gguf_torch import llama_cpp_logits

MIXES = ("q4_k_m", "q5_k_m", "q6_k")
GGML_Q8_0 = 8  # ggml_type


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("lab-k-home")
    seed_host(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(path))
        yield path


def _isolated(home: Path, ftype: int) -> Path:
    """tiny-k's f16 preset at llama.cpp's `ftype`, head and token table kept at Q8_0."""
    import llama_cpp

    src = resolve("synthetic:tiny-k@f16").path("gguf", "llamacpp")
    dst = home / f"tiny-k-{ftype}-q8-ends.gguf"
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype, p.nthread = ftype, 2
    p.output_tensor_type = p.token_embedding_type = GGML_Q8_0
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(),
                                          ctypes.byref(p)) == 0
    return dst


@pytest.mark.parametrize(("ftype", "bound"), [(18, 1e-12), (15, 2e-5)], ids=["q6_K", "q4_K"])
def test_k_quant_layers_follow_ggml_numerics(home: Path, ftype: int, bound: float) -> None:
    path = _isolated(home, ftype)
    kl = max_kl(llama_cpp_logits(path, IDS), lab_logits(path, IDS))
    print(f"\nftype {ftype} layers, Q8_0 head and table: max KL(llama.cpp || lab) {kl:.1e}")
    assert kl <= bound


@pytest.mark.parametrize(("mix", "bound"), [("q5_k_m", 1e-12), ("q4_k_m", 1e-6)])
def test_odd_width_fallbacks_follow_ggml_numerics(home: Path, mix: str, bound: float) -> None:
    """tiny's rows of 64 hold no K block: llama.cpp stores Q5_K_M's matrices as Q5_1 (q8_1
    activations: the min term through s_x = fp16(d·Σq)) and Q4_K_M's as Q5_0, heads at
    Q8_0. Measured: Q5_1 KL 0 (bit for bit), Q5_0 6.7e-7."""
    path = resolve(f"synthetic:tiny@{mix}").path("gguf", "lab")
    kl = max_kl(llama_cpp_logits(path, IDS), lab_logits(path, IDS))
    print(f"\ntiny@{mix} (fallback types): max KL(llama.cpp || lab) {kl:.1e}")
    assert kl <= bound


@pytest.mark.parametrize("mix", MIXES)
def test_a_downloaded_mix_runs_on_lab_kernels_close_to_llama_cpp(home: Path, mix: str) -> None:
    from strata.backends.torch_backend import TorchBackend

    path = resolve(f"synthetic:tiny-k@{mix}").path("gguf", "lab")
    want = llama_cpp_logits(path, IDS)
    got = lab_logits(path, IDS)
    lab = max_kl(want, got)
    backend = TorchBackend()
    backend.load(resolve(str(path)), LoadConfig(device="cpu", dtype="float32"))
    float_path = max_kl(want, backend.logits(IDS))
    backend.close()
    print(f"\n{mix}: max KL(llama.cpp || lab) {lab:.1e}, || torch (float) {float_path:.1e}")
    assert lab <= 2e-5 and float_path >= 4 * lab
    assert np.array_equal(want.argmax(-1), got.argmax(-1))


def test_the_lab_serves_k_quants_with_its_own_kernels(home: Path) -> None:
    """No dequantised copy: the K-quant matrices keep their bytes — moved into strata's x8
    layout where a SIMD x8 kernel serves (AVX2 everywhere these tests run; AVX-512 VNNI where
    the CPU has it), every byte of the file's tensor recoverable — and every linear is a lab
    kernel (the verified built-in of its type)."""
    import torch

    import strata.lab
    from strata.engine.weights import read_range
    from strata.kernels.ops import _kquant_x8
    from strata.lab.plan import LINEAR_OPS, REPACKED, X8_OPS

    path = resolve("synthetic:tiny-k@q4_k_m").path("gguf", "lab")
    model = strata.lab.load(path, "cpu", n_ctx=64)
    for kind, packed in REPACKED.items():
        row = model.kernels.choices[LINEAR_OPS[kind]].decision.impl
        x8 = model.kernels.choices[X8_OPS[packed]].decision.impl
        assert row is not None and row.name.startswith("c."), row
        # the x8 kernel asks at least as much of this CPU as the row one (AVX2, or AVX-512
        # VNNI where the CPU has it), never the portable one against a tuned row kernel
        assert x8 is not None and set(x8.requires.isa) >= set(row.requires.isa), (row, x8)
        assert x8.requires.isa
    held = {n: w for n, w in model.weights.tensors.items() if len(w.shape) == 2}
    assert {w.kind for w in held.values()} == {"Q4_Kx8", "Q6_Kx8"}
    assert all(n in model.held and model.held[n] is w for n, w in held.items())  # one copy
    file = read_range(Path(path), None, None, torch.device("cpu"))
    for name, w in held.items():
        original = file.tensors[name]
        kind = LINEAR_OPS[original.kind].removeprefix("linear_")  # q4_K, q6_K
        assert original.kind == w.kind.removesuffix("x8") and w.nbytes == original.nbytes
        assert torch.equal(_kquant_x8.unpack(kind, w.data, w.shape[1]), original.data), name
        if w.shape[0] >= 8:
            assert not torch.equal(w.data, original.data), f"{name}: not moved"
