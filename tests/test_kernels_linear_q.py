"""Quantised linear layers with ggml's numerics: linear_q8_0, q4_0, q5_0, q4_1 and q5_1.

x is quantised to q8_0 blocks as ggml's AVX2 path does (d = fp16(amax/127), id = 127/amax,
round half to even), then integer block dots against the GGUF weights. Checked here: the
spec's reference against an independent numpy integer computation; a tiny case worked out
by hand against the C kernels themselves; the planted inputs (exact ties, a zero block, an
fp16-subnormal d_x); every built-in implementation through the real sandbox (C on every
verify shape and seed, Triton under the interpreter on one small ragged shape); and
deliberately wrong kernels (fp32 activations, round half away from zero) that the verifier
must reject — the tolerance has to tell "quantised the ggml way" from "not quantised".
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch

from strata.kernels import checks
from strata.kernels.impl import builtin_implementations, from_source
from strata.kernels.ops import _linear_q, _quant
from strata.kernels.ops._shapes import model_dims
from strata.kernels.spec import get_spec
from strata.kernels.verify import Pending, VerifyContext, plan
from tests.conftest import run_sandboxed, sandbox_verify_context, verify_cases

OPS = ("linear_q8_0", "linear_q4_0", "linear_q5_0", "linear_q4_1", "linear_q5_1")
SOURCES = Path(__file__).parent.parent / "src/strata/kernels/sources/c"


# -- an independent oracle: numpy, float32 quantisation and integer dots -------------------------

def numpy_ggml(kind: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """out [B, N] float64 computed apart from the spec: ggml's q8_0 quantisation of x in
    numpy float32 (np.rint: half to even), the weights decoded byte by byte, integer dots."""
    B, K = x.shape
    nb = K // 32
    xb = x.astype(np.float32).reshape(B, nb, 32)
    amax = np.abs(xb).max(axis=2)
    dx = (amax / np.float32(127)).astype(np.float16).astype(np.float64)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    qx = np.rint(xb * inv[:, :, None]).astype(np.int64)  # float32 product, then rounded
    blocks = w.reshape(w.shape[0], nb, -1)
    dw = blocks[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float64)
    if kind == "q8_0":
        qw = blocks[:, :, 2:].view(np.int8).astype(np.int64)
    elif kind == "q4_0":
        body = blocks[:, :, 2:].astype(np.int64)
        qw = np.concatenate([body & 0xF, body >> 4], axis=2) - 8
    else:  # q5_0 / q4_1 / q5_1: [d, (m,)] [qh: little-endian uint32 of fifth bits] nibbles
        mins = kind in ("q4_1", "q5_1")
        at = 4 if mins else 2
        body = blocks[:, :, -16:].astype(np.int64)
        qw = np.concatenate([body & 0xF, body >> 4], axis=2)
        if kind != "q4_1":
            qh = blocks[:, :, at:at + 4].copy().view("<u4")[:, :, 0].astype(np.int64)
            qw = qw + 16 * ((qh[:, :, None] >> np.arange(32)) & 1)
        if not mins:
            qw = qw - 16
    isum = np.einsum("bkj,nkj->bnk", qx, qw)  # int64, exact
    out = (isum * dx[:, None, :] * dw[None, :, :]).sum(axis=2)
    if kind in ("q4_1", "q5_1"):  # + m_w * s_x, s_x = fp16(float32(amax/127) * sum q_x)
        m = blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float64)
        d32 = (amax / np.float32(127)).astype(np.float32)
        s_x = (d32 * qx.sum(axis=2).astype(np.float32)).astype(np.float16).astype(np.float64)
        out = out + s_x @ m.T
    return out


@pytest.mark.parametrize("op", OPS)
def test_reference_equals_numpy_integer_arithmetic(op: str) -> None:
    spec = get_spec(op)
    kind = op.removeprefix("linear_")
    for shape in spec.shapes["verify"]:
        for seed in (0, 1, 2):
            x, w = spec.make_inputs(shape, "float32", seed, "cpu")
            ref = spec.reference(x.double(), w)
            want = numpy_ggml(kind, x.numpy(), w.numpy())
            assert ref.dtype == torch.float32 and tuple(ref.shape) == spec.out_shape(shape)
            np.testing.assert_allclose(ref.double().numpy(), want, rtol=1e-6,
                                       atol=1e-6 * max(1.0, float(np.abs(want).max())))
            eager = spec.vendor()(x, w)  # the baseline computes the same op, in float32
            torch.testing.assert_close(eager.double(), ref.double(), atol=2e-4, rtol=2e-4)


def test_inputs_plant_ties_a_zero_block_and_a_subnormal_scale() -> None:
    spec = get_spec("linear_q8_0")
    x, _ = spec.make_inputs({"B": 5, "N": 3, "K": 256}, "float32", 0, "cpu")
    xb = x.reshape(5, -1, 32)
    amax = xb.abs().amax(dim=2)
    inv = torch.where(amax != 0, 127.0 / amax.clamp_min(1e-30), torch.zeros_like(amax))
    v = xb * inv[:, :, None]
    ties = (v - v.floor()) == 0.5
    even_vs_away = ties & (torch.round(v) != torch.sign(v) * torch.floor(v.abs() + 0.5))
    assert int(even_vs_away.sum()) >= 5 * 5  # every row: round-half-even matters
    assert bool((amax == 0).any())  # an all-zero block: d = id = 0
    d = (amax / 127).to(torch.float16).float()
    assert bool(((d > 0) & (d < 6.1e-5)).any())  # an fp16-subnormal activation scale


def test_llm_shapes_follow_the_presets() -> None:
    for op in OPS:
        llm = get_spec(op).shapes["llm"]
        for d in model_dims():
            assert {"B": 1, "N": d.hidden, "K": d.hidden} in llm
            assert {"B": _linear_q.PREFILL_ROWS, "N": d.ffn, "K": d.hidden} in llm
            assert {"B": 1, "N": d.hidden, "K": d.ffn} in llm
        assert all(s["K"] % 32 == 0 for s in llm)


# -- a case worked out by hand, against the kernels themselves -----------------------------------

def _hand_case(kind: str) -> tuple[np.ndarray, np.ndarray, float]:
    """One row of x (K = 64, two blocks), one weight row: (x, w bytes, out worked out by hand).

    Block 0 of x: amax = 31.75 = 127 * 0.25, so d_x = 0.25 and id = 4 exactly; x*id holds the
    ties 2.5 -> 2, -2.5 -> -2, 1.5 -> 2, 0.5 -> 0 (half to even) and 127. Block 1 is zero.
    Weights: block 0 scale 0.5 (fp16 0x3800), block 1 scale 2.0; q8_0 values 3, -1, 5, 7,
    -128 at the five nonzero x positions (q4_0: nibbles 11, 7, 13, 15, 0 = 3, -1, 5, 7, -8).
    out = 0.5 * 0.25 * (3*127 + (-1)*2 + 5*(-2) + 7*2 + w4*0) = 0.125 * 383 = 47.875.
    """
    x = np.zeros((1, 64), np.float32)
    x[0, [0, 1, 2, 3, 4]] = np.array([127, 2.5, -2.5, 1.5, 0.5], np.float32) * 0.25
    values = [3, -1, 5, 7, -128 if kind == "q8_0" else -8]
    if kind == "q8_0":
        q = np.zeros((2, 32), np.int8)
        q[0, :5] = values
        body = q.view(np.uint8)
    else:
        nib = np.full((2, 32), 8, np.uint8)  # value 0
        nib[0, :5] = np.array(values) + 8
        body = (nib[:, :16] | (nib[:, 16:] << 4)).astype(np.uint8)
    scales = np.array([0.5, 2.0], np.float16).view(np.uint8).reshape(2, 2)
    w = np.concatenate([scales, body], axis=1).reshape(1, -1)
    return x, np.ascontiguousarray(w), 0.125 * 383


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
@pytest.mark.parametrize("variant", ["naive", "avx2"])
def test_c_kernels_give_the_hand_computed_result(kind: str, variant: str) -> None:
    from strata.host import _profile
    from strata.kernels.capability import host_caps
    from strata.native import load_shared

    source = SOURCES / f"linear_{kind}.{variant}.c"
    impl = from_source(source)
    if impl.requires.check(host_caps(_profile())):
        pytest.skip(f"{variant} does not run here")
    x, w, want = _hand_case(kind)
    assert numpy_ggml(kind, x, w)[0, 0] == want
    fn = getattr(load_shared(source), f"strata_linear_{kind}")
    out = np.full((1, 1), np.nan, np.float32)
    fn(out.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p),
       w.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(1), ctypes.c_int64(1),
       ctypes.c_int64(64))
    assert out[0, 0] == np.float32(want)
    # and a random case with several rows of x and weights, against numpy's integers
    spec = get_spec(f"linear_{kind}")
    xr, wr = (t.numpy() for t in spec.make_inputs({"B": 6, "N": 13, "K": 320}, "float32", 2,
                                                  "cpu"))
    out = np.full((6, 13), np.nan, np.float32)
    fn(out.ctypes.data_as(ctypes.c_void_p), xr.ctypes.data_as(ctypes.c_void_p),
       wr.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(6), ctypes.c_int64(13),
       ctypes.c_int64(320))
    want_r = numpy_ggml(kind, xr, wr)
    np.testing.assert_allclose(out, want_r, rtol=1e-5, atol=1e-5 * np.sqrt((want_r ** 2).mean()))


# -- the real sandbox ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory):
    yield from sandbox_verify_context(tmp_path_factory.mktemp("kernels-linq-home"))


def _run(ctx: VerifyContext, pendings: list[Pending]) -> list:
    return run_sandboxed(ctx, pendings)


def test_the_vnni_q8_0_kernel_equals_the_avx2_one_bit_for_bit() -> None:
    """linear_q8_0.avx512vnni.c claims the AVX2 kernel's exact integers and float32 steps
    (two rows per 512-bit register, q_x + 128 through vpdpbusd less 128 x the weights' sum):
    equal outputs bit for bit, on every tail of its 4-row groups and 4-row x tiles, with
    weights at -128 and 127 and an all-zero block of x. (Not with a NaN in x, which no
    clause specifies: ggml's amax drops it and quantises it to -128, which the AVX2 sign
    trick, as ggml's, multiplies as -128 * |w|; vpdpbusd multiplies it exactly.)"""
    from strata.host import _profile
    from strata.kernels.capability import host_caps
    from strata.native import load_shared

    vnni = SOURCES / "linear_q8_0.avx512vnni.c"
    if from_source(vnni).requires.check(host_caps(_profile())):
        pytest.skip("no AVX-512 VNNI here")
    fns = [load_shared(s).strata_linear_q8_0
           for s in (SOURCES / "linear_q8_0.avx2.c", vnni)]
    rng = np.random.default_rng(7)
    for b, n, k in [(2, 4, 64), (5, 7, 96), (9, 6, 128), (4, 9, 2048), (3, 5, 17408),
                    (64, 130, 256)]:
        w = _quant.random_blocks("q8_0", n, k, int(rng.integers(1 << 30))).numpy().copy()
        blocks = w.reshape(n, k // 32, 34)
        blocks[0, 0, 2:] = np.uint8(0x80)  # -128 everywhere in a block
        blocks[-1, -1, 2:] = 127
        x = rng.standard_normal((b, k)).astype(np.float32) * 3
        x[0, :32] = 0.0  # an all-zero block of x (d = 0)
        outs = []
        for fn in fns:
            out = np.full((b, n), -1.0, np.float32)
            fn(out.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p),
               w.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(b), ctypes.c_int64(n),
               ctypes.c_int64(k))
            outs.append(out)
        assert np.isfinite(outs[0][0]).all() and (outs[0] != -1.0).all(), (b, n, k)
        assert outs[0].tobytes() == outs[1].tobytes(), (b, n, k)


def _pending(impl, ctx: VerifyContext, **job) -> Pending:
    p = plan(impl, ctx)
    assert isinstance(p, Pending), (impl.key, p)
    p.job.update(job)
    return p


def test_c_implementations_verify_in_the_sandbox(ctx: VerifyContext) -> None:
    """Every verify shape (B > 1 with ragged tails of both tiles, several thread chunks) and
    every seed, on one, the default and an oversubscribed number of threads."""
    impls = [i for i in builtin_implementations() if i.op in OPS and i.dialect == "c"]
    assert {(i.op, i.name) for i in impls} == {(op, n) for op in OPS
                                               for n in ("c.naive", "c.avx2")} | \
        {("linear_q8_0", "c.avx512vnni")}
    runnable = [i for i in impls if not i.requires.check(ctx.caps)]
    for verdict in _run(ctx, [_pending(i, ctx) for i in runnable]):
        assert verdict.status == "pass", (verdict.impl.key, verdict.reason, verdict.message,
                                          verdict.details)
        assert verdict.cases == verify_cases(verdict.impl.op, 3)


def test_triton_implementations_verify_under_the_interpreter(ctx: VerifyContext) -> None:
    """One small ragged shape, one seed (the interpreter is slow): several programs along N,
    a partial chunk of K blocks, rows of x with planted ties and a zero block."""
    pytest.importorskip("triton")
    impls = [i for i in builtin_implementations() if i.op in OPS and i.dialect == "triton"]
    assert {i.op for i in impls} == set(OPS)
    pendings = [_pending(i, ctx, seeds=[0], shapes=[{"B": 2, "N": 19, "K": 96}])
                for i in impls]
    for verdict in _run(ctx, pendings):
        assert verdict.status == "pass", (verdict.impl.key, verdict.reason, verdict.message,
                                          verdict.details)


# Wrong on purpose, each a copy of the naive kernel with one change.
FP32_X = {  # no activation quantisation: the block dot against x itself (matvec's numerics)
    "old": """                int32_t isum = 0;
                for (int j = 0; j < QK; j++) isum += (int32_t)qw[j] * (int32_t)qb[j];
                const float d = half_to_float((uint16_t)(p[0] | (p[1] << 8))) *
                                dx[b * nblocks + blk];
                sum += d * (float)isum;""",
    "new": """                const float *xb = x + b * K + blk * QK;
                float bsum = 0.0f;
                (void)qb;
                for (int j = 0; j < QK; j++) bsum += (float)qw[j] * xb[j];
                sum += half_to_float((uint16_t)(p[0] | (p[1] << 8))) * bsum;"""}
HALF_AWAY = {"old": "q[j] = (int8_t)nearbyintf(x[j] * id);",
             "new": "q[j] = (int8_t)roundf(x[j] * id);"}


WRONG = {"fp32-activations-q8_0": ("q8_0", FP32_X), "round-half-away-q4_0": ("q4_0", HALF_AWAY),
         "round-half-away-q8_0": ("q8_0", HALF_AWAY)}


def test_kernels_without_ggml_quantisation_are_rejected(ctx: VerifyContext,
                                                        tmp_path: Path) -> None:
    pendings = []
    for name, (kind, change) in WRONG.items():
        source = (SOURCES / f"linear_{kind}.naive.c").read_text()
        assert change["old"] in source
        path = tmp_path / f"linear_{kind}.{name}.c"
        path.write_text(source.replace(change["old"], change["new"]))
        pendings.append(_pending(from_source(path, origin="external"), ctx))
    for name, verdict in zip(WRONG, _run(ctx, pendings), strict=True):
        assert (verdict.status, verdict.reason) == ("fail", checks.WRONG_RESULT), \
            (name, verdict.message)


def test_quantised_weights_come_from_the_shared_generator() -> None:
    """Weights are _quant's random blocks (subnormal scales, -128 in q8_0) for both ops."""
    for op in OPS:
        kind = op.removeprefix("linear_")
        _, w = get_spec(op).make_inputs({"B": 1, "N": 5, "K": 96}, "float32", 3, "cpu")
        assert torch.equal(w, _quant.random_blocks(kind, 5, 96, 3))
