"""Lab ops for training, part 2: attention_lse, attention_backward, cross_entropy_fused.

Their float64 references against torch autograd through independent PyTorch paths (SDPA,
F.cross_entropy), every built-in C implementation through the real sandbox, the Triton ones
under the interpreter on small ragged shapes, and wrong kernels that the verifier must
reject (a backward that ignores the causal mask, one that forgets the grouped heads)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from strata.kernels.buffers import InputStream
from strata.kernels.impl import builtin_implementations, from_source
from strata.kernels.shm import Arena
from strata.kernels.spec import get_spec
from strata.kernels.verify import Pending, VerifyContext, finish, run_pending
from tests.conftest import sandbox_verify_context, verify_cases

OPS = ("attention_lse", "attention_backward", "cross_entropy_fused")
GQA_SHAPES = [{"H": 4, "Hkv": 2, "T": 5, "D": 16}, {"H": 6, "Hkv": 2, "T": 33, "D": 12},
              {"H": 3, "Hkv": 3, "T": 9, "D": 35}]


def _wide(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.double() if t.is_floating_point() else t for t in inputs]


def _sdpa_grads(q, k, v, dout, scale):
    """Autograd through torch's own SDPA (math path in float64), GQA by enable_gqa."""
    qg, kg, vg = (t.detach().double().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(qg[None], kg[None], vg[None], is_causal=True,
                                       scale=scale, enable_gqa=True)[0]
    return (o, *torch.autograd.grad(o, (qg, kg, vg), dout.double()))


# -- references ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", GQA_SHAPES)
def test_attention_references_equal_float64_autograd_of_sdpa(shape: dict[str, int]) -> None:
    fwd, bwd = get_spec("attention_lse"), get_spec("attention_backward")
    scale = fwd.params_for(shape)["scale"]
    h, hkv, t, d = shape["H"], shape["Hkv"], shape["T"], shape["D"]
    for seed in (0, 2):
        q, k, v, o, lse, dout = bwd.make_inputs(shape, "float32", seed, "cpu")
        want_o, dq, dk, dv = _sdpa_grads(q, k, v, dout, scale)
        # lse from the scores written out with an explicit lower-triangular mask
        kk = k.double().repeat_interleave(h // hkv, dim=0)
        scores = (q.double() @ kk.transpose(1, 2)) * scale
        keep = torch.ones(t, t, dtype=torch.bool).tril()
        want_lse = torch.logsumexp(scores.masked_fill(~keep, float("-inf")), dim=-1)
        packed = fwd.reference(*_wide([q, k, v]), scale=scale)
        torch.testing.assert_close(packed, torch.cat([want_o.flatten(), want_lse.flatten()]),
                                   rtol=1e-10, atol=1e-10)
        # the generator's o / lse are that forward, rounded to float32
        torch.testing.assert_close(o, want_o.float())
        torch.testing.assert_close(lse, want_lse.float())
        grads = bwd.reference(*_wide([q, k, v, o, lse, dout]), scale=scale)
        assert grads.shape == bwd.out_shape(shape) == (h * t * d + 2 * hkv * t * d,)
        torch.testing.assert_close(grads, torch.cat([dq.flatten(), dk.flatten(), dv.flatten()]),
                                   rtol=1e-10, atol=1e-10)


def test_cross_entropy_reference_is_loss_and_softmax_minus_onehot() -> None:
    spec = get_spec("cross_entropy_fused")
    for shape in spec.shapes["verify"]:
        logits, target = spec.make_inputs(shape, "float32", 2, "cpu")
        x = logits.double()
        packed = spec.reference(x, target)
        rows = shape["rows"]
        assert packed.shape == spec.out_shape(shape)
        torch.testing.assert_close(packed[:rows], F.cross_entropy(x, target, reduction="none"))
        onehot = F.one_hot(target, shape["V"]).double()
        torch.testing.assert_close(packed[rows:].view(rows, -1), torch.softmax(x, -1) - onehot)


def test_eager_paths_agree_with_the_references_within_tolerance() -> None:
    """The speed baselines compute the same op (CPU flash kernels for attention)."""
    from strata.kernels.checks import compare

    for op in OPS:
        spec = get_spec(op)
        for shape in spec.shapes["verify"][:4]:
            inputs = spec.make_inputs(shape, "float32", 1, "cpu")
            params = spec.params_for(shape)
            ref = spec.reference(*_wide(inputs), **params)
            assert compare(spec.vendor()(*inputs, **params), ref, spec.tolerance("float32")) \
                is None, (op, shape)


def test_benchmark_stream_recomputes_o_and_lse_after_mixing_inputs() -> None:
    """The timed-input stream mixes pool sets linearly; o and lse must follow q, k, v or the
    oracle and every kernel would disagree."""
    spec = get_spec("attention_backward")
    shape = {"H": 4, "Hkv": 2, "T": 9, "D": 16}
    arena = Arena()
    try:
        slot = InputStream(spec, shape, "float32", arena, slots_n=1).refresh()
        _check_o_and_lse(spec, shape, slot)
    finally:
        arena.close()


def _check_o_and_lse(spec, shape: dict[str, int], slot) -> None:
    q, k, v, o, lse, _ = slot.inputs
    want_o, want_lse = get_spec("attention_lse").vendor()(
        q, k, v, **spec.params_for(shape)).split([o.numel(), lse.numel()])
    torch.testing.assert_close(o.flatten(), want_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.flatten(), want_lse, rtol=1e-5, atol=1e-5)


# -- the real sandbox ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory):
    yield from sandbox_verify_context(tmp_path_factory.mktemp("kernels-bwd-home"))


def _verify(ctx: VerifyContext, impls: list, shapes: dict[str, list] | None = None,
            seeds: tuple[int, ...] = (0, 2)) -> list:
    """Verdicts of real sandboxed verifications, three at a time (the CLI runs every shape
    and seed; here normal and heavy-tailed inputs, to keep the file quick)."""
    from concurrent.futures import ThreadPoolExecutor

    pending = []
    for impl in impls:
        job = {"mode": "verify", "device": "cpu", "dtypes": ["float32"], "seeds": list(seeds)}
        if shapes and impl.op in shapes:
            job["shapes"] = shapes[impl.op]
        pending.append(Pending(impl, "cpu", job, ctx.policy))
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda p: run_pending(p, ctx.caps), pending))
    return [finish(p, r, ctx) for p, r in zip(pending, results, strict=True)]


def test_c_implementations_verify_in_the_sandbox(ctx: VerifyContext) -> None:
    impls = [i for i in builtin_implementations() if i.op in OPS and i.dialect == "c"]
    assert {(i.op, i.name) for i in impls} == {(op, n) for op in OPS
                                                for n in ("c.naive", "c.avx2")}
    runnable = [i for i in impls if not i.requires.check(ctx.caps)]
    assert any(i.name == "c.naive" for i in runnable)
    for v in _verify(ctx, runnable):
        assert v.status == "pass", (v.impl.key, v.reason, v.message, v.details)
        # every verify shape, incl. the one large enough for the threaded path
        assert v.cases == verify_cases(v.impl.op, 2)


def test_triton_implementations_verify_under_the_interpreter(ctx: VerifyContext) -> None:
    """One small ragged shape each (the interpreter is slow): GQA with two key blocks; a
    vocabulary of two 4096-wide chunks; heavy-tailed inputs."""
    pytest.importorskip("triton")
    impls = [i for i in builtin_implementations() if i.op in OPS and i.dialect == "triton"]
    shapes = {"attention_lse": [GQA_SHAPES[1]], "attention_backward": [GQA_SHAPES[1]],
              "cross_entropy_fused": [{"rows": 3, "V": 5000}]}
    for v in _verify(ctx, impls, shapes, seeds=(2,)):
        assert v.status == "pass", (v.impl.key, v.reason, v.message, v.details)


NAIVE = Path(__file__).parent.parent / "src/strata/kernels/sources/c/attention_backward.naive.c"
MUTANTS = {
    # every key of the sequence instead of s <= t: the causal mask forgotten
    "no_causal_mask": ("for (int64_t s = 0; s <= t; s++)", "for (int64_t s = 0; s < T; s++)"),
    # dk/dv restart at every query head: only the group's last head is kept, not the sum
    "dk_not_summed": ("for (int64_t h = g * group; h < (g + 1) * group; h++) {",
                      "for (int64_t h = g * group; h < (g + 1) * group; h++) {\n"
                      "for (int64_t i = 0; i < T * D; i++) { gk[i] = 0.0; gv[i] = 0.0; }"),
}


def test_wrong_backwards_are_rejected(ctx: VerifyContext, tmp_path: Path) -> None:
    source = NAIVE.read_text()
    mutants = []
    for name, (old, new) in MUTANTS.items():
        assert old in source
        path = tmp_path / f"attention_backward.{name}.c"
        path.write_text(source.replace(old, new))
        mutants.append(from_source(path, origin="external"))
    shapes = {"attention_backward": get_spec("attention_backward").shapes["verify"][1:4]}
    for name, verdict in zip(MUTANTS, _verify(ctx, mutants, shapes), strict=True):
        assert verdict.status == "fail", name
        # unmasked future keys can overflow exp(s - lse) to inf: a NaN/Inf mismatch is as
        # wrong as a value outside the tolerance
        allowed = ("wrong_result", "nan_parity") if name == "no_causal_mask" else \
            ("wrong_result",)
        assert verdict.reason in allowed, (name, verdict.reason, verdict.message)
