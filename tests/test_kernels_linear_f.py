"""The float-weight linears (linear_f32, linear_f16) and KV-cache attention
(attention_cached): the contract's fixed dtypes, the built-ins through the real sandbox,
deliberately wrong variants, and a hand check of attention_cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.errors import InputError
from tests.conftest import run_sandboxed, sandbox_verify_context, verify_cases

torch = pytest.importorskip("torch")


# -- the contract: a fixed dtype next to the call's float dtype --------------------------------

def test_linear_f16_takes_float32_x_with_a_float16_weight(strata_home: Path) -> None:
    from strata import kernels

    choice = kernels.get("linear_f16", db=strata_home / "strata.db")
    x, w = torch.randn(3, 40), torch.randn(5, 40).half()
    out = torch.empty(3, 5)
    choice(out, x, w)
    ref = x.half().double() @ w.double().T
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(InputError, match=r"w must be float16, not torch\.float32"):
        choice(out, x, w.float())
    with pytest.raises(InputError, match="mixed float dtypes"):
        choice(out, x.double(), w)


def test_linear_f32_keeps_the_one_float_dtype_rule(strata_home: Path) -> None:
    from strata import kernels

    choice = kernels.get("linear_f32", db=strata_home / "strata.db")
    x, w = torch.randn(2, 9), torch.randn(4, 9)
    with pytest.raises(InputError, match="mixed float dtypes"):
        choice(torch.empty(2, 4), x, w.half())
    with pytest.raises(InputError, match="do not fit together"):
        choice(torch.empty(2, 4), x, torch.randn(4, 8))


def test_linear_f16_tolerance_separates_rounding_x_from_not() -> None:
    """Over every verify shape and seed: float32 sums of f16(x)·w (another order than the
    float64 oracle) pass; the same sums with x not rounded to float16 fail."""
    from strata.kernels import checks
    from strata.kernels.spec import get_spec

    spec = get_spec("linear_f16")
    tol = spec.tolerance("float32")
    missed = []
    for shape in spec.shapes["verify"]:
        for seed in (0, 1, 2):
            x, w = spec.make_inputs(shape, "float32", seed, "cpu")
            assert x.dtype == torch.float32 and w.dtype == torch.float16
            ref = spec.reference(x.double(), w.double())
            right = x.half().float() @ w.float().T
            assert checks.compare(right, ref, tol) is None, (shape, seed)
            if checks.compare(x @ w.float().T, ref, tol) is None:
                missed.append((shape, seed))
    # one product (K = 1) can escape when that x happens to sit close to a float16 value
    assert all(shape["K"] == 1 for shape, _ in missed) and len(missed) <= 1, missed


def test_attention_cached_by_hand() -> None:
    """H=2 query heads on Hkv=1, T=2 new rows after P=2 cached ones, C=6 cache rows (the last
    two never to be read: NaN), D=2, scale 1, written out in numpy; head 0's first query
    is zero, so its answer is the mean of v rows 0..2. The spec's reference and vendor path
    must agree, and so must every C built-in."""
    import numpy as np

    from strata.kernels.dialects.c import load_c
    from strata.kernels.impl import builtin_implementations
    from strata.kernels.spec import get_spec

    nan = float("nan")
    q = np.array([[[0.0, 0.0], [1.0, -1.0]],
                  [[2.0, 0.5], [-1.0, 3.0]]], dtype=np.float32)
    k = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 2.0], [nan, nan],
                   [nan, nan]]], dtype=np.float32)
    v = np.array([[[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-2.0, 4.0], [nan, nan],
                   [nan, nan]]], dtype=np.float32)
    P, T = 2, 2
    want = np.zeros((2, T, 2))
    for h in range(2):
        for t in range(T):
            n = P + t + 1  # query t sees cache rows 0..P+t
            scores = np.array([float(q[h, t] @ k[0, j]) for j in range(n)])
            p = np.exp(scores - scores.max())
            p /= p.sum()
            want[h, t] = sum(p[j] * v[0, j].astype(np.float64) for j in range(n))
    np.testing.assert_allclose(want[0, 0], v[0, :3].mean(axis=0), rtol=1e-12)

    spec = get_spec("attention_cached")
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    pos = torch.tensor([P], dtype=torch.int64)
    ref = spec.reference(tq.double(), tk.double(), tv.double(), pos, scale=1.0)
    np.testing.assert_allclose(ref.numpy(), want, rtol=1e-12, atol=1e-12)
    eager = spec.vendor()(tq, tk, tv, pos, scale=1.0)
    np.testing.assert_allclose(eager.numpy(), want, rtol=1e-5, atol=1e-6)
    from strata.kernels.service import session

    caps = session().caps
    for impl in builtin_implementations():
        if impl.op != "attention_cached" or impl.dialect != "c" or impl.requires.check(caps):
            continue
        out = torch.full((2, T, 2), nan)
        load_c(impl, spec, "cpu").bind(out, [tq, tk, tv, pos], {"scale": 1.0})()
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6,
                                   err_msg=impl.name)


# -- the real sandbox ----------------------------------------------------------------------------

OPS = ("linear_f32", "linear_f16", "attention_cached")
C_DIR = Path(__file__).parent.parent / "src/strata/kernels/sources/c"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory):
    yield from sandbox_verify_context(tmp_path_factory.mktemp("kernels-linear-f-home"))


def _run(ctx, pendings: list) -> list:
    return run_sandboxed(ctx, pendings)


def _pending(ctx, impl, shapes: list[dict[str, int]] | None = None,
             seeds: tuple[int, ...] = (0, 1, 2)):
    from strata.kernels.verify import Pending

    job = {"mode": "verify", "device": "cpu", "dtypes": ["float32"], "seeds": list(seeds)}
    if shapes:
        job["shapes"] = shapes
    return Pending(impl, "cpu", job, ctx.policy)


def test_c_builtins_verify_in_the_sandbox(ctx) -> None:
    """Every verify shape; the largest of each op run the thread team (on one, the default
    and an oversubscribed number of threads). The AVX2 kernels on every seed (input
    distribution), the naive ones on one (test_kernels_lab's fixture runs them all again)."""
    from strata.kernels.impl import builtin_implementations

    impls = [i for i in builtin_implementations() if i.op in OPS and i.dialect == "c"]
    assert {(i.op, i.name) for i in impls} == {(op, n) for op in OPS
                                                for n in ("c.naive", "c.avx2")}
    runnable = [i for i in impls if not i.requires.check(ctx.caps)]
    seeds = {"c.avx2": (0, 1, 2), "c.naive": (0,)}
    for v in _run(ctx, [_pending(ctx, i, seeds=seeds[i.name]) for i in runnable]):
        assert v.status == "pass", (v.impl.key, v.reason, v.message, v.details)
        assert v.cases == verify_cases(v.impl.op, len(seeds[v.impl.name]))


def test_triton_builtins_verify_under_the_interpreter(ctx) -> None:
    """Small ragged shapes, one seed (the interpreter is slow): B > 1 with ragged N and K;
    decode at depth with unused cache rows, and several queries at depth."""
    pytest.importorskip("triton")
    from strata.kernels.impl import builtin_implementations

    small = {"linear_f32": [{"B": 3, "N": 37, "K": 70}],
             "linear_f16": [{"B": 3, "N": 37, "K": 70}],
             "attention_cached": [{"H": 4, "Hkv": 2, "T": 1, "P": 37, "C": 45, "D": 16},
                                  {"H": 3, "Hkv": 1, "T": 5, "P": 12, "C": 20, "D": 12}]}
    impls = [i for i in builtin_implementations() if i.op in OPS and i.dialect == "triton"]
    assert {i.op for i in impls} == set(OPS)
    for v in _run(ctx, [_pending(ctx, i, small[i.op], seeds=(0,)) for i in impls]):
        assert v.status == "pass", (v.impl.key, v.reason, v.message, v.details)


# Deliberately wrong variants, each one edit of a built-in naive source: (file, what, by).
NAIVE_F16 = "linear_f16.naive.c"
NAIVE_ATTN = "attention_cached.naive.c"
WRONG = {
    # the activations not rounded to float16 first (plain f32 x times the f16 weight): off
    # by ~2^-12 of the output's scale, which linear_f16's tolerance must not allow
    "f16_x_not_rounded": (NAIVE_F16, "xh[k] = half_to_float(float_to_half(x[b * K + k]));",
                          "xh[k] = x[b * K + k];"),
    "cached_ignores_pos": (NAIVE_ATTN, "int64_t P = pos[0]", "int64_t P = 0 * pos[0]"),
    # the new rows attend each other without the causal mask (rows < P+T only)
    "cached_not_causal": (NAIVE_ATTN, "n = P + t + 1;", "n = P + T;"),
    "cached_one_row_too_many": (NAIVE_ATTN, "n = P + t + 1;", "n = P + t + 2 <= C ? "
                                "P + t + 2 : C;"),
    # every cache row read, the unused ones masked by a zero weight: right on a clean
    # cache, NaN on one whose unused rows hold NaN (the contract: they are never read)
    "cached_reads_unused_rows": (NAIVE_ATTN, "float *o = out + (h * T + t) * D;",
                                 "for (int64_t s = n; s < C; s++)\n"
                                 "                for (int64_t i = 0; i < D; i++)\n"
                                 "                    acc[i] += 0.0 * vh[s * D + i];\n"
                                 "            float *o = out + (h * T + t) * D;"),
}


def _wrong_source(tmp_path: Path, name: str) -> Path:
    base, old, new = WRONG[name]
    text = (C_DIR / base).read_text()
    assert text.count(old) == 1, (name, old)
    text = text.replace(old, new)
    path = tmp_path / f"{name}.c"
    path.write_text(text)
    return path


def test_wrong_variants_are_rejected(ctx, tmp_path: Path) -> None:
    from strata.kernels.impl import from_source

    impls = [from_source(_wrong_source(tmp_path, name), origin="external") for name in WRONG]
    verdicts = _run(ctx, [_pending(ctx, i) for i in impls])
    for name, v in zip(WRONG, verdicts, strict=True):
        assert v.status == "fail", (name, v.status, v.message)
        assert v.reason in ("wrong_result", "nan_parity"), (name, v.reason, v.message)
