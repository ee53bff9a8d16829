"""gpt-oss's two lab ops: swiglu_oai (the clamped SwiGLU) and attention_sinks (attention with
a sink logit per head over a KV cache, windowed or not). The references against hand
computations in plain float64 loops, the C built-ins called directly and verified in the
sandbox, and deliberately wrong variants (a clamp dropped, the sink ignored or scaled, the
window ignored) rejected."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.conftest import run_sandboxed, sandbox_verify_context, verify_cases

torch = pytest.importorskip("torch")

NAN, INF = float("nan"), float("inf")
C_DIR = Path(__file__).parent.parent / "src/strata/kernels/sources/c"


def _c_kernels(op: str) -> list:
    """The op's built-in C kernels this host can run, loaded in-process."""
    from strata.kernels.dialects.c import load_c
    from strata.kernels.impl import builtin_implementations
    from strata.kernels.service import session
    from strata.kernels.spec import get_spec

    caps, spec = session().caps, get_spec(op)
    impls = [i for i in builtin_implementations() if i.op == op and i.dialect == "c"]
    assert {i.name for i in impls} == {"c.naive", "c.avx2"}
    return [(i.name, load_c(i, spec, "cpu")) for i in impls if not i.requires.check(caps)]


# -- swiglu_oai ----------------------------------------------------------------------------------

def _swiglu_oai_by_hand(a: float, b: float) -> float:
    x = min(a, 7.0)
    y = max(-7.0, min(b, 7.0))
    z = 1.702 * -x
    sigmoid_term = 0.0 if z > 700 else 1.0 / (1.0 + math.exp(z))  # e^z beyond float64: 0
    return x * sigmoid_term * (y + 1.0)


# (a, b) at hand-picked points: the clamps on each side, a << 0, the +1 of the up branch
POINTS = [(0.0, 3.0), (1.0, 0.0), (-1.0, 2.0), (2.5, -1.0), (7.0, 1.0), (7.5, 1.0),
          (50.0, 0.5), (1e4, -0.5), (-7.5, 0.0), (-20.0, 5.0), (-89.0, 1.0), (-1e4, 7.0),
          (1.0, 7.0), (1.0, 8.0), (1.0, 1e3), (1.0, -7.0), (1.0, -50.0), (3.0, -1.0),
          (60.0, -60.0)]


def test_swiglu_oai_by_hand() -> None:
    from strata.kernels.spec import get_spec

    a = torch.tensor([p[0] for p in POINTS], dtype=torch.float64)[None]
    b = torch.tensor([p[1] for p in POINTS], dtype=torch.float64)[None]
    want = [_swiglu_oai_by_hand(x, y) for x, y in POINTS]
    # spot values: the clamp makes a = 50 and a = 7 gate alike, and b = 1e3 count as 7
    assert want[POINTS.index((50.0, 0.5))] == pytest.approx(7 / (1 + math.exp(-11.914)) * 1.5)
    assert want[POINTS.index((1.0, 1e3))] == want[POINTS.index((1.0, 7.0))]
    assert want[POINTS.index((1.0, 8.0))] == want[POINTS.index((1.0, 7.0))]
    assert want[POINTS.index((3.0, -1.0))] == 0.0  # y + 1 = 0
    assert want[POINTS.index((-1e4, 7.0))] == 0.0  # e^(1.702·1e4) overflows: 0, not NaN
    assert want[POINTS.index((-7.5, 0.0))] < -1e-6  # a clamped from above only

    spec = get_spec("swiglu_oai")
    ref = spec.reference(a, b)[0].tolist()
    assert ref == pytest.approx(want, rel=1e-12, abs=1e-300)
    for name, kernel in _c_kernels("swiglu_oai"):
        out = torch.full((1, len(POINTS)), NAN)
        kernel.bind(out, [a.float(), b.float()], {})()
        assert torch.isfinite(out).all(), name
        assert out[0].tolist() == pytest.approx(want, rel=1e-5, abs=1e-30), name


def test_swiglu_oai_matches_the_engines_torch_gate() -> None:
    """The torch ops backend's swiglu_oai (engine/ops_torch.py) computes the same gate."""
    from strata.engine.ops_torch import TorchOps
    from strata.kernels.spec import get_spec

    spec = get_spec("swiglu_oai")
    a, b = spec.make_inputs({"rows": 5, "cols": 33}, "float32", 2, "cpu")
    a[0, :10] = torch.tensor([8.0, 50.0, -60.0, -1e3, 7.0, -7.0, 1e4, -1e4, 0.0, 7.5])
    ref = spec.reference(a.double(), b.double())
    torch.testing.assert_close(TorchOps().glu("swiglu_oai", a, b).double(), ref,
                               rtol=1e-5, atol=1e-6)


# -- attention_sinks -----------------------------------------------------------------------------

def _attention_sinks_by_hand(q, k, v, P: int, W: int, sinks, scale: float) -> list:
    """out[h][t][i] in float64 loops: softmax over the rows query t sees and the sink (no
    value), the max taken over both."""
    H, T, D = len(q), len(q[0]), len(q[0][0])
    group = H // len(k)
    out = []
    for h in range(H):
        rows_h = []
        for t in range(T):
            end = P + t + 1
            lo = max(0, end - W) if W > 0 else 0
            kv = h // group
            s = {j: scale * sum(q[h][t][i] * k[kv][j][i] for i in range(D))
                 for j in range(lo, end)}
            m = max(max(s.values()), sinks[h])
            e = {j: math.exp(s[j] - m) for j in s}
            total = sum(e.values()) + math.exp(sinks[h] - m)
            rows_h.append([sum(e[j] * v[kv][j][i] for j in e) / total for i in range(D)])
        out.append(rows_h)
    return out


def _sinks_case(H: int, Hkv: int, T: int, P: int, C: int, D: int, W: int, seed: int = 0):
    """Small float32 inputs; cache rows no query sees hold NaN."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=g) for s in ((H, T, D), (Hkv, C, D), (Hkv, C, D)))
    sinks = torch.randn(H, generator=g) * 2
    lo = max(0, P - W + 1) if W > 0 else 0
    for t in (k, v):
        t[:, :lo] = NAN
        t[:, P + T:] = NAN
    return q, k, v, torch.tensor([P, W], dtype=torch.int64), sinks


CASES = [  # (H, Hkv, T, P, C, D, W): windowed, unwindowed, GQA, decode and a chunk
    (4, 2, 3, 5, 10, 4, 3), (4, 2, 3, 5, 10, 4, 0), (3, 1, 1, 7, 9, 5, 2),
    (2, 2, 4, 0, 6, 3, 0), (6, 2, 5, 2, 9, 8, 4), (2, 1, 2, 3, 5, 4, 1)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "H{}-Hkv{}-T{}-P{}-C{}-D{}-W{}".format(*c))
def test_attention_sinks_by_hand(case: tuple[int, ...]) -> None:
    """The reference, the vendor path and every C built-in against float64 loops; the
    reference is also softmax over [scores..., sink] with the sink's column dropped."""
    from strata.kernels.spec import get_spec

    H, _, T, P, _, D, W = case
    q, k, v, pos, sinks = _sinks_case(*case)
    scale = 1.0 / math.sqrt(D)
    want = torch.tensor(_attention_sinks_by_hand(q.double().tolist(), k.double().tolist(),
                                                 v.double().tolist(), P, W,
                                                 sinks.double().tolist(), scale),
                        dtype=torch.float64)
    spec = get_spec("attention_sinks")
    ref = spec.reference(q.double(), k.double(), v.double(), pos, sinks.double(), scale=scale)
    torch.testing.assert_close(ref, want, rtol=1e-12, atol=1e-12)
    eager = spec.vendor()(q, k, v, pos, sinks, scale=scale)
    torch.testing.assert_close(eager.double(), want, rtol=1e-5, atol=1e-6)
    for name, kernel in _c_kernels("attention_sinks"):
        out = torch.full((H, T, D), NAN)
        kernel.bind(out, [q, k, v, pos, sinks], {"scale": scale})()
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-6, msg=name)


def test_a_sink_of_minus_inf_is_plain_attention_and_a_huge_one_takes_all_weight() -> None:
    """sinks = -inf: attention_window (W > 0) and attention_cached (W = 0) exactly; a sink
    1e4 above the scores: zeros, no NaN — the reference and every C built-in."""
    from strata.kernels.spec import get_spec

    spec = get_spec("attention_sinks")
    for W, plain in ((3, "attention_window"), (0, "attention_cached")):
        q, k, v, pos, _ = _sinks_case(4, 2, 3, 5, 10, 4, W, seed=1)
        scale = 0.5
        f64 = [t.double() for t in (q, k, v)]
        none = torch.full((4,), -INF)
        pos_plain = pos if W else pos[:1]
        want = get_spec(plain).reference(*f64, pos_plain, scale=scale)
        got = spec.reference(*f64, pos, none.double(), scale=scale)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        huge = torch.full((4,), 1e4)
        assert spec.reference(*f64, pos, huge.double(), scale=scale).abs().max() == 0.0
        for name, kernel in _c_kernels("attention_sinks"):
            for sinks, expect in ((none, want), (huge, torch.zeros_like(want))):
                out = torch.full(want.shape, NAN)
                kernel.bind(out, [q, k, v, pos, sinks], {"scale": scale})()
                torch.testing.assert_close(out.double(), expect, rtol=1e-5, atol=1e-6,
                                           msg=f"{name} W={W} sink {float(sinks[0])}")


def test_the_engines_torch_attention_agrees() -> None:
    """The torch ops backend's attention with sinks (engine/ops_torch.py) is this op, with
    and without a window (its masked rows zeroed: it multiplies them by weight 0)."""
    from strata.engine.ops_torch import TorchOps
    from strata.kernels.spec import get_spec

    spec = get_spec("attention_sinks")
    for W in (3, 0):
        q, k, v, pos, sinks = _sinks_case(4, 2, 3, 5, 10, 4, W, seed=2)
        theirs = TorchOps().attention(q, k.nan_to_num(0.0), v.nan_to_num(0.0), 5, pos, 0.5,
                                      window=W, sinks=sinks)
        ours = spec.reference(q, k, v, pos, sinks, scale=0.5)
        torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-6)


# -- the sandbox: the built-ins verify, wrong variants do not -------------------------------------

OPS = ("swiglu_oai", "attention_sinks")


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory):
    yield from sandbox_verify_context(tmp_path_factory.mktemp("kernels-oai-home"))


def _run(ctx, pendings: list) -> list:
    return run_sandboxed(ctx, pendings)


def _pending(ctx, impl, seeds: tuple[int, ...] = (0, 1, 2)):
    from strata.kernels.verify import Pending

    job = {"mode": "verify", "device": "cpu", "dtypes": ["float32"], "seeds": list(seeds)}
    return Pending(impl, "cpu", job, ctx.policy)


def test_c_builtins_verify_in_the_sandbox(ctx) -> None:
    """Every verify shape and clause case (the largest attention shapes run the thread team);
    the AVX2 kernels on every seed, the naive ones on one."""
    from strata.kernels.impl import builtin_implementations

    impls = [i for i in builtin_implementations() if i.op in OPS and i.dialect == "c"]
    assert {(i.op, i.name) for i in impls} == {(op, n) for op in OPS
                                                for n in ("c.naive", "c.avx2")}
    runnable = [i for i in impls if not i.requires.check(ctx.caps)]
    seeds = {"c.avx2": (0, 1, 2), "c.naive": (0,)}
    for v in _run(ctx, [_pending(ctx, i, seeds=seeds[i.name]) for i in runnable]):
        assert v.status == "pass", (v.impl.key, v.reason, v.message, v.details)
        assert v.cases == verify_cases(v.impl.op, len(seeds[v.impl.name]))


# Deliberately wrong variants, each one edit of a built-in naive source: (file, what, by).
NAIVE_SWIGLU = "swiglu_oai.naive.c"
NAIVE_SINKS = "attention_sinks.naive.c"
WRONG = {
    "swiglu_no_gate_clamp": (NAIVE_SWIGLU, "const float x = limit < a[i] ? limit : a[i];",
                             "const float x = a[i];"),
    "swiglu_no_up_clamp": (NAIVE_SWIGLU,
                           "const float y = b[i] < -limit ? -limit : (limit < b[i] ? limit : "
                           "b[i]);", "const float y = b[i];"),
    "swiglu_no_plus_one": (NAIVE_SWIGLU, "* (y + 1.0f)", "* y"),
    "sinks_ignored": (NAIVE_SINKS, "const double sink = sinks[h];",
                      "const double sink = -INFINITY;"),
    "sinks_scaled": (NAIVE_SINKS, "const double sink = sinks[h];",
                     "const double sink = sinks[h] * scale;"),
    "sinks_of_kv_head": (NAIVE_SINKS, "const double sink = sinks[h];",
                         "const double sink = sinks[h / group];"),
    # every row attended, its scratch sized for them (a lo = 0 alone overran a scratch of W
    # scores: heap corruption, a crash now and then instead of the wrong result it is)
    "sinks_window_ignored": (NAIVE_SINKS, "W = pos[1] > 0 ? pos[1] : 0;", "W = 0;"),
    "sinks_no_window_as_one": (NAIVE_SINKS, "W = pos[1] > 0 ? pos[1] : 0;",
                               "W = pos[1] > 0 ? pos[1] : 1;"),
}


def _wrong_source(tmp_path: Path, name: str) -> Path:
    base, old, new = WRONG[name]
    text = (C_DIR / base).read_text()
    assert text.count(old) == 1, (name, old)
    path = tmp_path / f"{name}.c"
    path.write_text(text.replace(old, new))
    return path


def test_wrong_variants_are_rejected(ctx, tmp_path: Path) -> None:
    from strata.kernels.impl import from_source

    impls = [from_source(_wrong_source(tmp_path, name), origin="external") for name in WRONG]
    verdicts = _run(ctx, [_pending(ctx, i, seeds=(0, 1)) for i in impls])
    for name, v in zip(WRONG, verdicts, strict=True):
        assert v.status == "fail", (name, v.status, v.message)
        assert v.reason in ("wrong_result", "nan_parity"), (name, v.reason, v.message)


def test_triton_implementations_verify_under_the_interpreter(ctx) -> None:
    """Every verify shape and clause case, one seed (the interpreter is slow): windows,
    query rows in more than one block, GQA, sinks of -inf and huge ones."""
    pytest.importorskip("triton")
    from strata.kernels.impl import builtin_implementations

    impls = [i for i in builtin_implementations() if i.op in OPS and i.dialect == "triton"]
    assert {i.op for i in impls} == set(OPS)
    for v in _run(ctx, [_pending(ctx, i, seeds=(0,)) for i in impls]):
        assert v.status == "pass", (v.impl.key, v.reason, v.message, v.details)
        assert v.cases == verify_cases(v.impl.op, 1)
