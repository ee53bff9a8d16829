"""Lab ops for training, part 1: rmsnorm_backward, silu_mul_backward, rope_backward.

Their float64 references against torch autograd through the forward ops' own references,
the packing of several gradients into one output, the vendor baselines, every built-in C
implementation through the real sandbox (rmsnorm_backward's threaded dw reduction included),
the Triton ones under the interpreter on small ragged shapes, and a wrong dw reduction
(each thread's rows summed apart, never combined) that the verifier must reject."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from strata.kernels import checks
from strata.kernels.impl import builtin_implementations, from_source
from strata.kernels.spec import get_spec
from strata.kernels.verify import Pending, VerifyContext, verify_many
from tests.conftest import run_sandboxed, sandbox_verify_context, verify_cases

OPS = ("rmsnorm_backward", "silu_mul_backward", "rope_backward")
FORWARD = {"rmsnorm_backward": "rmsnorm", "silu_mul_backward": "silu_mul",
           "rope_backward": "rope"}


def _autograd(op: str, inputs: list[torch.Tensor], params: dict) -> list[torch.Tensor]:
    """Gradients of the forward op's reference in float64: (dx, dw) / (da, db) / (dx,)."""
    fwd = get_spec(FORWARD[op])
    *primal, dy = [t.double() for t in inputs]
    if op == "rope_backward":  # dy [T,H,D] is the only gradient input; cos/sin are constants
        dy, cos, sin = (t.double() for t in inputs)
        x = torch.randn(dy.shape, dtype=torch.float64, requires_grad=True)
        return list(torch.autograd.grad(fwd.reference(x, cos, sin), (x,), dy))
    leaves = [t.requires_grad_() for t in primal]
    return list(torch.autograd.grad(fwd.reference(*leaves, **params), leaves, dy))


@pytest.mark.parametrize("op", OPS)
def test_reference_is_float64_autograd_of_the_forward_packed_in_order(op: str) -> None:
    spec = get_spec(op)
    for shape in spec.shapes["verify"]:
        for seed in (0, 1, 2):
            inputs = spec.make_inputs(shape, "float32", seed, "cpu")
            params = spec.params_for(shape)
            ref = spec.reference(*[t.double() for t in inputs], **params)
            assert ref.dtype == torch.float64 and tuple(ref.shape) == spec.out_shape(shape)
            want = torch.cat([g.flatten() for g in _autograd(op, inputs, params)])
            torch.testing.assert_close(ref.flatten(), want, rtol=1e-12, atol=1e-12)
            eager = spec.vendor()(*inputs, **params)  # the baseline computes the same op
            assert checks.compare(eager, ref, spec.tolerance("float32")) is None, shape


def test_training_shapes_follow_the_train_presets() -> None:
    from strata.train.presets import PRESETS

    tiny = PRESETS["tiny"]
    rows = tiny.batch * tiny.model.ctx
    assert {"rows": rows, "cols": tiny.model.hidden} in get_spec("rmsnorm_backward").shapes["llm"]
    assert {"rows": rows, "cols": tiny.model.ffn} in get_spec("silu_mul_backward").shapes["llm"]
    assert {"T": rows, "H": tiny.model.n_heads, "D": tiny.model.head_dim} in \
        get_spec("rope_backward").shapes["llm"]
    for op in OPS:  # one wider than every preset, too
        assert len(get_spec(op).shapes["llm"]) >= 2


# -- the real sandbox ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory):
    yield from sandbox_verify_context(tmp_path_factory.mktemp("kernels-bwd-home"))


def _run(ctx: VerifyContext, pendings: list[Pending]) -> list:
    return run_sandboxed(ctx, pendings)


def test_avx2_implementations_verify_in_the_sandbox(ctx: VerifyContext) -> None:
    """Every verify shape and seed (rmsnorm_backward's largest runs its threaded dw path on
    1, the default and an oversubscribed number of threads). The naive C kernels (and the
    Triton ones on every shape) go through the same gate in test_kernels_lab's fixture of
    every built-in."""
    impls = [i for i in builtin_implementations() if i.op in OPS and i.dialect == "c"]
    assert {(i.op, i.name) for i in impls} == {(op, n) for op in OPS
                                                for n in ("c.naive", "c.avx2")}
    for v in verify_many([i for i in impls if i.name == "c.avx2"], ctx, jobs=2):
        if v.impl.requires.check(ctx.caps):
            assert v.status == "unavailable"
            continue
        assert v.status == "pass", (v.impl.key, v.reason, v.message, v.details)
        assert v.cases == verify_cases(v.impl.op, 3)


def test_triton_implementations_verify_under_the_interpreter(ctx: VerifyContext) -> None:
    """Small ragged shapes, one seed (the interpreter is slow): several dw blocks, a row
    longer than one Triton block, an odd half head size."""
    pytest.importorskip("triton")
    small = {"rmsnorm_backward": [{"rows": 67, "cols": 257}, {"rows": 3, "cols": 9001}],
             "silu_mul_backward": [{"rows": 5, "cols": 1033}],
             "rope_backward": [{"T": 33, "H": 3, "D": 34}]}
    pendings = [Pending(i, "cpu", {"mode": "verify", "device": "cpu", "dtypes": ["float32"],
                                   "seeds": [0], "shapes": small[i.op]}, ctx.policy)
                for i in builtin_implementations() if i.op in small and
                i.dialect == "triton"]
    assert len(pendings) == 3
    for verdict in _run(ctx, pendings):
        assert verdict.status == "pass", (verdict.impl.key, verdict.reason, verdict.message,
                                          verdict.details)


AVX2 = Path(__file__).parent.parent / "src/strata/kernels/sources/c/rmsnorm_backward.avx2.c"
# Each thread sums its own rows' dw and stores it: the last thread to finish wins, the other
# threads' rows are lost. Right on one thread, wrong on several.
UNCOMBINED = '''
void strata_rmsnorm_backward(float *out, const float *x, const float *w, const float *dy,
                             int64_t rows, int64_t cols, float eps) {
    float *dw = out + rows * cols;
#pragma omp parallel
    {
        float *mine = calloc((size_t)cols, sizeof(float));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            row_backward(out + r * cols, mine, x + r * cols, w, dy + r * cols, cols, eps);
        memcpy(dw, mine, (size_t)cols * sizeof(float));
        free(mine);
    }
}
'''


def test_a_dw_summed_per_thread_without_combining_is_a_data_race(
        ctx: VerifyContext, tmp_path: Path) -> None:
    source = AVX2.read_text()
    head = source[:source.index("static void block_backward")]
    path = tmp_path / "rmsnorm_backward.uncombined.c"
    path.write_text(head + UNCOMBINED)
    impl = from_source(path, origin="external")
    if impl.requires.check(ctx.caps):
        pytest.skip("no avx2/fma here")
    pending = Pending(impl, "cpu", {"mode": "verify", "device": "cpu", "dtypes": ["float32"],
                                    "seeds": [0], "shapes": [{"rows": 67, "cols": 257}]},
                      ctx.policy)
    [verdict] = _run(ctx, [pending])
    assert (verdict.status, verdict.reason) == ("fail", checks.DATA_RACE), verdict.message
