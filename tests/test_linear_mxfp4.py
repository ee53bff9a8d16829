"""linear_mxfp4: GGUF MXFP4 weights (gpt-oss's experts) with llama.cpp's CPU numerics
(`ggml_vec_dot_mxfp4_q8_0`: x quantised to q8_0, integer dots of the e2m1 table values, the
block scale 2^(e-128)).

Checked here: the spec's reference against gguf-py's MXFP4 dequantisation (an independent
implementation of the format) times x quantised to q8_0 in numpy; blocks gguf-py's own
quantizer writes decode alike in strata's _quant, as do random blocks over every exponent
byte; a case worked out by hand against both C kernels; both built-in C kernels through the
real sandbox (every verify shape, seed and clause case); and wrong copies of the naive
kernel (q4_0's nibble - 8, a scale 2^(e-127), the subnormal exponents decoded as normal
ones) that the verifier must reject.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch

from strata.kernels import checks
from strata.kernels.impl import builtin_implementations, from_source
from strata.kernels.ops import _quant
from strata.kernels.spec import get_spec
from strata.kernels.verify import Pending, VerifyContext, plan
from tests.conftest import run_sandboxed, sandbox_verify_context, verify_cases

gguf = pytest.importorskip("gguf")

OP = "linear_mxfp4"
SOURCES = Path(__file__).parent.parent / "src/strata/kernels/sources/c"
MXFP4 = gguf.GGMLQuantizationType.MXFP4


# -- an independent oracle: gguf-py's weights, numpy's q8_0 activations ----------------------------

def q8_0_numpy(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's AVX2 quantize_row_q8_0 in numpy float32: (q int64 [B, K/32, 32], d float64 =
    fp16(amax/127) [B, K/32]); np.rint rounds half to even."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(axis=2)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float64)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    return np.rint(xb * inv[:, :, None]).astype(np.int64), d


def oracle(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """out [B, N] float64: gguf-py's dequantised weights (float32 kv·2^(e-128), exact) against
    d_x·q_x, summed in float64."""
    q, d = q8_0_numpy(x)
    wv = gguf.quants.dequantize(w, MXFP4).reshape(w.shape[0], -1).astype(np.float64)
    ax = (q * d[:, :, None]).reshape(x.shape[0], -1)
    return ax @ wv.T


def _cases() -> list[tuple[str, list[torch.Tensor]]]:
    """Every verify shape at two seeds, and every clause case (as the verifier makes them)."""
    spec = get_spec(OP)
    out = [(f"{s} seed {seed}", spec.make_inputs(s, "float32", seed, "cpu"))
           for s in spec.shapes["verify"] for seed in (0, 1)]
    for clause, shape, seed in spec.clause_cases():
        inputs = spec.make_inputs(dict(shape), "float32", seed, "cpu")
        clause.apply(inputs, shape, seed)
        out.append((f"{clause.name} seed {seed}", inputs))
    return out


def test_reference_equals_gguf_py_weights_times_ggml_q8_0_activations() -> None:
    spec = get_spec(OP)
    for what, (x, w) in _cases():
        ref = spec.reference(x.double(), w)
        want = oracle(x.numpy(), w.numpy())
        assert ref.dtype == torch.float32 and np.isfinite(want).all(), what
        np.testing.assert_allclose(ref.double().numpy(), want, rtol=1e-6,
                                   atol=1e-6 * max(1.0, float(np.abs(want).max())), err_msg=what)
        eager = spec.vendor()(x, w)  # the baseline: the same op with float32 sums
        assert checks.compare(eager, ref, spec.tolerance("float32")) is None, what


def test_the_op_is_not_q4_0s_nor_fp32_activations() -> None:
    """The tolerance tells the op from its neighbours: the weights read as q4_0's nibble - 8,
    and x left in float32 (matvec's numerics), are both far outside it."""
    spec = get_spec(OP)
    x, w = spec.make_inputs({"B": 3, "N": 40, "K": 256}, "float32", 0, "cpu")
    ref = spec.reference(x.double(), w)
    wv = gguf.quants.dequantize(w.numpy(), MXFP4).reshape(40, 256).astype(np.float64)
    fp32_x = torch.from_numpy(x.double().numpy() @ wv.T).float()
    assert checks.compare(fp32_x, ref, spec.tolerance("float32")) is not None
    blocks = w.numpy().reshape(40, -1, 17)
    body = blocks[:, :, 1:].astype(np.int64)
    minus8 = (np.concatenate([body & 15, body >> 4], axis=2) - 8).astype(np.float64)
    scale = np.exp2(blocks[:, :, 0].astype(np.float64) - 128)
    q, d = q8_0_numpy(x.numpy())
    nib = (q * d[:, :, None]).reshape(3, -1) @ (minus8 * scale[:, :, None]).reshape(40, -1).T
    assert checks.compare(torch.from_numpy(nib).float(), ref,
                          spec.tolerance("float32")) is not None


# -- the block format against gguf-py --------------------------------------------------------------

def _bit_equal(w: np.ndarray, k: int, what: str) -> None:
    ours = _quant.dequantize("mxfp4", torch.from_numpy(np.ascontiguousarray(w)), k,
                             torch.float32).numpy()
    with np.errstate(over="ignore"):  # e = 255 with code 7: 12 * 2^127 is inf, for both
        theirs = gguf.quants.dequantize(w, MXFP4).reshape(w.shape[0], k)
    assert ours.dtype == theirs.dtype == np.float32
    differ = ours.view(np.uint32) != theirs.view(np.uint32)  # -0.0 vs 0.0 counts too
    assert not differ.any(), f"{what}: {int(differ.sum())} of {ours.size} values differ"


def test_blocks_gguf_py_quantizes_decode_alike() -> None:
    """gguf-py's quantizer (e = floor(log2 amax) - 2 + 127, nearest table value) on weights of
    gpt-oss's size, with all-zero, tiny (e 0 and 1) and huge (e 252: amax 2^127, float32's
    largest power of two) blocks planted."""
    g = torch.Generator().manual_seed(3)
    data = (torch.randn(16, 2880, generator=g) * 0.02).numpy().astype(np.float32)
    data[0, :32] = 0.0
    for row, amax in ((1, 2.0 ** -125), (2, 2.0 ** -124), (3, 2.0 ** 127)):  # e 0, 1, 252
        block = data[row, :32].astype(np.float64)
        data[row, :32] = (block / np.abs(block).max() * amax).astype(np.float32)
    with np.errstate(over="ignore"):  # the quantizer's own error terms at amax 2^127
        w = gguf.quants.quantize(data, MXFP4)
    assert w.dtype == np.uint8 and w.shape == (16, 2880 // 32 * 17)
    e = w.reshape(16, -1, 17)[:, :, 0]
    assert e[:4, 0].tolist() == [0, 0, 1, 252]
    _bit_equal(w, 2880, "gguf-py's quantizer")
    # and their values are what was quantised, to 4-bit precision
    values = _quant.dequantize("mxfp4", torch.from_numpy(w), 2880).numpy()
    assert np.abs(values[4:] - data[4:]).max() <= 0.25 * np.abs(data[4:]).max()


def test_random_blocks_over_every_exponent_decode_alike() -> None:
    w = _quant.random_blocks("mxfp4", 8, 1024, seed=5).numpy().copy()
    _bit_equal(w, 1024, "random blocks")
    e = w.reshape(-1, 17)[:, 0]
    lo, hi = _quant.MXFP4_EXPONENTS
    assert set(_quant.MXFP4_PLANTED) <= set(e.tolist())
    assert ((e >= lo) & (e <= hi)).mean() > 0.8
    w.reshape(-1, 17)[:, 0] = np.arange(e.size) % 256
    _bit_equal(w, 1024, "every exponent byte 0..255")


def test_generated_weights_are_mxfp4_blocks() -> None:
    _, w = get_spec(OP).make_inputs({"B": 1, "N": 5, "K": 96}, "float32", 3, "cpu")
    assert w.dtype == torch.uint8 and tuple(w.shape) == (5, 3 * 17)
    assert torch.equal(w, _quant.random_blocks("mxfp4", 5, 96, 3))


# -- a case worked out by hand, against the kernels themselves -------------------------------------

def _hand_case() -> tuple[np.ndarray, np.ndarray, float]:
    """One row of x (K = 64, two blocks), one weight row: (x, w bytes, out by hand).

    x block 0: amax 31.75 = 127 * 0.25, so d_x = 0.25 and id = 4 exactly; x*id = 127, 2.5 -> 2,
    -2.5 -> -2, 1.5 -> 2 (half to even), the rest 0. Weight block 0: e = 129 (scale 2),
    codes 7, 15, 5, 9 at those places (kv 12, -12, 6, -1), code 8 (-0) elsewhere:
    isum = 12*127 - 12*2 + 6*(-2) - 1*2 = 1486, out = 2 * 0.25 * 1486 = 743.
    Block 1: e = 255 (2^127) with only ±0 codes against x's ones (d_x = 1/127): adds 0, no NaN.
    """
    x = np.zeros((1, 64), np.float32)
    x[0, :4] = np.array([127, 2.5, -2.5, 1.5], np.float32) * 0.25
    x[0, 32:] = 1.0
    codes = np.full((2, 32), 8, np.uint8)
    codes[0, :4] = (7, 15, 5, 9)
    codes[1, ::2] = 0
    body = codes[:, :16] | (codes[:, 16:] << 4)
    w = np.concatenate([np.array([[129], [255]], np.uint8), body], axis=1).reshape(1, -1)
    return x, np.ascontiguousarray(w), 743.0


def _call(fn, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    fn(out.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p),
       w.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.shape[0]), ctypes.c_int64(w.shape[0]),
       ctypes.c_int64(x.shape[1]))
    return out


@pytest.mark.parametrize("variant", ["naive", "avx2"])
def test_c_kernels_give_the_hand_computed_result(variant: str) -> None:
    from strata.host import _profile
    from strata.kernels.capability import host_caps
    from strata.native import load_shared

    source = SOURCES / f"{OP}.{variant}.c"
    if from_source(source).requires.check(host_caps(_profile())):
        pytest.skip(f"{variant} does not run here")
    x, w, want = _hand_case()
    assert oracle(x, w)[0, 0] == want
    fn = getattr(load_shared(source), f"strata_{OP}")
    assert _call(fn, x, w)[0, 0] == np.float32(want)
    # several rows of x and of weights (B > 1 tiles, a ragged group, an odd block count)
    xr, wr = (t.numpy() for t in get_spec(OP).make_inputs({"B": 6, "N": 13, "K": 288},
                                                          "float32", 2, "cpu"))
    want_r = oracle(xr, wr)
    np.testing.assert_allclose(_call(fn, xr, wr), want_r, rtol=1e-5,
                               atol=1e-5 * np.sqrt((want_r ** 2).mean()))


# -- the real sandbox ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory):
    yield from sandbox_verify_context(tmp_path_factory.mktemp("kernels-mxfp4-home"))


def _run(ctx: VerifyContext, impls: list) -> list:
    """Sandboxed runs of `impls`, two at a time (each its own worker process)."""
    pendings = []
    for impl in impls:
        p = plan(impl, ctx)
        assert isinstance(p, Pending), (impl.key, p)
        pendings.append(p)
    return run_sandboxed(ctx, pendings)


def test_c_implementations_verify_in_the_sandbox(ctx: VerifyContext) -> None:
    impls = [i for i in builtin_implementations() if i.op == OP and i.dialect == "c"]
    assert {i.name for i in impls} == {"c.naive", "c.avx2"}
    runnable = [i for i in impls if not i.requires.check(ctx.caps)]
    for verdict in _run(ctx, runnable):
        assert verdict.status == "pass", (verdict.impl.key, verdict.reason, verdict.message,
                                          verdict.details)
        assert verdict.cases == verify_cases(OP, 3)


def test_triton_implementation_verifies_under_the_interpreter(ctx: VerifyContext) -> None:
    """One small ragged shape and every clause case, one seed (the interpreter is slow):
    several programs along N, a partial chunk of K blocks, every exponent byte."""
    pytest.importorskip("triton")
    impls = [i for i in builtin_implementations() if i.op == OP and i.dialect == "triton"]
    assert len(impls) == 1
    pending = plan(impls[0], ctx)
    assert isinstance(pending, Pending), pending
    pending.job.update(seeds=[0], shapes=[{"B": 2, "N": 19, "K": 96}])
    for verdict in run_sandboxed(ctx, [pending]):
        assert verdict.status == "pass", (verdict.reason, verdict.message, verdict.details)


# Wrong on purpose, each a copy of the naive kernel with one change: (old, new) pairs, and
# the reasons the verifier may give
WRONG = {
    # q4_0's nibble - 8 in place of the e2m1 table
    "nibble-minus-8": ([("KV[p[1 + j] & 0x0F]", "((p[1 + j] & 0x0F) - 8)"),
                        ("KV[p[1 + j] >> 4]", "((p[1 + j] >> 4) - 8)")], {checks.WRONG_RESULT}),
    # 2^(e-127): the e2m1 values doubled without halving the scale
    "scale-not-halved": ([("(uint32_t)(e - 1) << 23", "(uint32_t)e << 23")],
                         {checks.WRONG_RESULT, checks.NAN_PARITY}),
    # (e-1) << 23 for every e: e = 0 gives -inf (the random blocks plant e = 0 and 1)
    "no-subnormal-exponents": ([("e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23",
                                 "(uint32_t)(e - 1) << 23")], {checks.NAN_PARITY}),
}


def test_wrong_kernels_are_rejected(ctx: VerifyContext, tmp_path: Path) -> None:
    source = (SOURCES / f"{OP}.naive.c").read_text()
    impls = []
    for name, (changes, _) in WRONG.items():
        text = source
        for old, new in changes:
            assert text.count(old) == 1, (name, old)
            text = text.replace(old, new)
        path = tmp_path / f"{OP}.{name}.c"
        path.write_text(text)
        impls.append(from_source(path, origin="external"))
    for (name, (_, reasons)), verdict in zip(WRONG.items(), _run(ctx, impls), strict=True):
        assert verdict.status == "fail" and verdict.reason in reasons, \
            (name, verdict.reason, verdict.message)
