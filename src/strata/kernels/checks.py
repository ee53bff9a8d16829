"""Pure checks on tensors used by verification (docs/architecture.md §8). Each returns None
when the check passes, else a Failure with a reason code and a one-line message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strata.kernels.spec import Tolerance

# Reason codes: stable names stored in the DB and asserted by the adversarial tests.
WRONG_RESULT = "wrong_result"
NAN_PARITY = "nan_parity"
CONSTANT_OUTPUT = "constant_output"
INPUT_INDEPENDENT = "input_independent"
NONDETERMINISTIC = "nondeterministic"
MODIFIED_INPUTS = "modified_inputs"
ASYNC_WRITE = "async_write"
LEFT_THREAD = "left_thread"
PATCHED_TIMER = "patched_timer"
CALLS_TORCH = "calls_torch_op"
CRASHED = "crashed"
TIMEOUT = "timeout"
BUILD_FAILED = "build_failed"
STATIC_CHECK = "static_check"
OUT_OF_BOUNDS = "out_of_bounds_write"
READS_OUTPUT = "reads_output_buffer"  # right with a NaN-filled output, wrong with another fill
DATA_RACE = "data_race"  # right on one thread, wrong (or different) on several
SANDBOX_VIOLATION = "sandbox_violation"
FORBIDDEN_LINK = "forbidden_link"  # the compiled object imports a symbol kernels may not use
MAX_SHOWN = 5


@dataclass
class Failure:
    reason: str
    message: str
    details: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "message": self.message, "details": self.details}


def _fmt_index(flat: int, shape: tuple[int, ...]) -> str:
    idx = []
    for n in reversed(shape):
        idx.append(flat % n)
        flat //= n
    return "[" + ",".join(str(i) for i in reversed(idx)) + "]"


def _first_mismatches(bad: Any, got: Any, want: Any) -> list[str]:
    """`[i,j]: got x, expected y` for the first flagged elements (`bad` is flat)."""
    return [f"{_fmt_index(i, tuple(got.shape))}: got {got.flatten()[i].item():.6g}, "
            f"expected {want.flatten()[i].item():.6g}"
            for i in bad.nonzero().flatten()[:MAX_SHOWN].tolist()]


def allowed_error(ref: Any, tol: Tolerance) -> Any:
    """atol scaled by the reference's RMS (outputs of reductions grow with the input size)
    plus rtol*|ref|, elementwise."""
    import torch

    finite = ref[torch.isfinite(ref)]
    rms = float(finite.pow(2).mean().sqrt()) if finite.numel() else 1.0
    allowed = tol.atol * max(1.0, rms) + tol.rtol * ref.abs()
    if tol.floor is not None:
        allowed = allowed + tol.floor.detach().to("cpu", torch.float64).reshape(ref.shape)
    return allowed


def compare(out: Any, ref: Any, tol: Tolerance) -> Failure | None:
    """Elementwise tolerance with NaN/Inf parity; lists the first mismatches."""
    import torch

    got = out.detach().to("cpu", torch.float64)
    want = ref.detach().to("cpu", torch.float64)
    if got.shape != want.shape:
        return Failure(WRONG_RESULT, f"output shape {tuple(got.shape)} != {tuple(want.shape)}")
    nan_bad = torch.isnan(got) != torch.isnan(want)
    inf_bad = torch.isinf(got) != torch.isinf(want)
    parity = (nan_bad | inf_bad).flatten()
    if bool(parity.any()):
        n = int(parity.sum())
        return Failure(NAN_PARITY, f"{n} element(s) NaN/Inf where the reference is not "
                       "(or the reverse); unwritten outputs stay NaN",
                       _first_mismatches(parity, got, want))
    finite = torch.isfinite(want)
    err = (got - want).abs().where(finite, torch.zeros_like(got))
    over = (err > allowed_error(want, tol)).flatten()
    if not bool(over.any()):
        return None
    return Failure(WRONG_RESULT, f"{int(over.sum())} of {over.numel()} element(s) outside "
                   f"atol={tol.atol:g}*max(1,rms) + rtol={tol.rtol:g}*|ref| (max abs error "
                   f"{float(err.max()):.3g})", _first_mismatches(over, got, want))


def constant_output(out: Any, ref: Any) -> Failure | None:
    """A (near) constant output where the reference varies: zeros, a fill, a fixed guess."""
    import torch

    if out.numel() < 2:
        return None
    got = out.detach().to("cpu", torch.float64)
    want = ref.detach().to("cpu", torch.float64)
    finite_ref = want[torch.isfinite(want)]
    if finite_ref.numel() < 2 or float(finite_ref.std()) == 0.0:
        return None
    finite = got[torch.isfinite(got)]
    if finite.numel() and float(finite.std()) <= 1e-9 * float(finite_ref.std()):
        return Failure(CONSTANT_OUTPUT, f"output is constant ({float(finite[0]):.6g}) where "
                       "the reference varies")
    return None


def same_values(a: Any, b: Any) -> bool:
    """Bitwise-equal including NaN positions."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.nan_to_num(1.2345e-7), b.nan_to_num(1.2345e-7)))


def unchanged_inputs(before: list[Any], after: list[Any], names: tuple[str, ...]) -> \
        Failure | None:
    changed = [name for name, b, a in zip(names, before, after, strict=True)
               if not same_values(b, a)]
    if changed:
        return Failure(MODIFIED_INPUTS, f"the kernel wrote into its input(s) "
                       f"{', '.join(changed)}; inputs are read-only")
    return None


def runs_agree(first: Any, second: Any, tol: Tolerance, ref: Any) -> Failure | None:
    """The two candidate runs (around the reference) must agree within the tolerance."""
    import torch

    a = first.detach().to("cpu", torch.float64)
    b = second.detach().to("cpu", torch.float64)
    diff = (a - b).abs().nan_to_num(0.0)
    if bool((diff > allowed_error(ref.to("cpu", torch.float64), tol)).any()) or \
            bool((torch.isnan(a) != torch.isnan(b)).any()):
        return Failure(NONDETERMINISTIC, "two runs on the same inputs disagree (max diff "
                       f"{float(diff.max()):.3g}): the result depends on state or timing")
    return None
