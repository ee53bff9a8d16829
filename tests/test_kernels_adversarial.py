"""Adversarial kernels: each cheat is rejected, with the reason code of the check meant for
it, and an honest external kernel passes. Kernels live in fixtures/kernels/adversarial/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import pytest

from strata.kernels import checks
from strata.kernels.impl import Implementation, from_source
from strata.kernels.sandbox import SandboxPolicy
from strata.kernels.service import Session
from strata.kernels.verify import SEEDS, Verdict, VerifyContext, verify
from tests.conftest import FIXTURES, run_cli, verify_cases

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # every verification is a sandboxed process importing torch

ADVERSARIAL = FIXTURES / "kernels" / "adversarial"

# Fixture -> the reason that must reject it with static checks off (the runtime checks).
CHEATS = {
    "constant_fill.c": {checks.CONSTANT_OUTPUT},
    "cached_output.c": {checks.INPUT_INDEPENDENT},
    "first_seed_only.c": {checks.WRONG_RESULT},
    "writes_inputs.c": {checks.MODIFIED_INPUTS},
    # finished within the guard's grace period or still running: a race, both are right;
    # on a loaded host the thread may not have written a thing by the time the judge reads
    # the output it prefilled with NaN — the same class caught one check earlier
    "background_thread.py": {checks.ASYNC_WRITE, checks.LEFT_THREAD, checks.NAN_PARITY},
    "calls_torch.py": {checks.CALLS_TORCH},
    # the convolution's own cheats (issue 28): a fixed kernel width, the interior only, a
    # decode step that hands back a stale state
    "conv_fixed_width.c": {checks.WRONG_RESULT},
    "conv_interior_only.c": {checks.NAN_PARITY, checks.WRONG_RESULT},
    "conv_step_keeps_state.c": {checks.WRONG_RESULT},
    # conv2d's: the interior only, the stride ignored, each filter read transposed
    "conv2d_interior_only.c": {checks.NAN_PARITY, checks.WRONG_RESULT},
    "conv2d_stride_one.c": {checks.WRONG_RESULT},
    "conv2d_weights_transposed.c": {checks.WRONG_RESULT},
}
PYTHON_CHEATS = [*(name for name in CHEATS if name.endswith(".py")), "patches_timer.py"]


def _external(name: str) -> Implementation:
    return from_source(ADVERSARIAL / name, origin="external")


def _verify(session: Session, impl: Implementation, **ctx: Any) -> Verdict:
    return verify(impl, VerifyContext(session.conn, session.fingerprint, session.caps, **ctx))


@pytest.mark.parametrize("name", list(CHEATS))
def test_runtime_checks_reject_each_cheat(name: str, kernel_session: Session) -> None:
    verdict = _verify(kernel_session, _external(name), static=False)
    assert verdict.status == "fail", verdict.to_dict()
    assert verdict.reason in CHEATS[name], verdict.to_dict()


def test_a_patched_clock_in_the_worker_changes_nothing(kernel_session: Session) -> None:
    """The judge times calls with its own clock in its own process: a kernel that slows the
    worker's clock tenfold (and computes right) is verified as what it is, and its benchmark
    figure is the judge's (not ten times faster than the same kernel unpatched)."""
    verdict = _verify(kernel_session, _external("patches_timer.py"), static=False)
    assert verdict.status == "pass", (verdict.reason, verdict.message)


def test_zeros_kernel_is_rejected_as_constant_output(kernel_session: Session) -> None:
    verdict = _verify(kernel_session, _external("zeros.c"), static=False)
    assert verdict.status == "fail"
    assert verdict.reason == checks.CONSTANT_OUTPUT, verdict.to_dict()


@pytest.mark.parametrize("name", PYTHON_CHEATS)
def test_static_check_rejects_python_cheats_before_running(name: str,
                                                           kernel_session: Session) -> None:
    verdict = _verify(kernel_session, _external(name))
    assert (verdict.status, verdict.reason) == ("fail", checks.STATIC_CHECK), verdict.to_dict()
    assert verdict.device is None and verdict.cases == 0  # nothing ran
    assert verdict.details


def test_honest_external_kernel_passes(kernel_session: Session) -> None:
    impl = _external("honest_rmsnorm.c")
    verdict = _verify(kernel_session, impl)  # static checks on, as for `kernels add`
    assert verdict.status == "pass", (verdict.reason, verdict.message)
    assert verdict.cases == verify_cases(impl.op, len(SEEDS), external=True)


def _no_children_left() -> bool:
    """No process of ours left, kernel workers above all. multiprocessing's resource
    tracker is not one: it lives as long as this process once any test used
    multiprocessing (a ring's LocalRing does), by design."""
    return not [p for p in psutil.Process().children(recursive=True)
                if "multiprocessing.resource_tracker" not in " ".join(_cmdline(p))]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # gone meanwhile: not left
        return ["multiprocessing.resource_tracker"]


def test_kernel_that_never_returns_times_out(kernel_session: Session) -> None:
    verdict = _verify(kernel_session, _external("infinite_loop.c"),
                      policy=SandboxPolicy(timeout_s=20.0))
    assert (verdict.status, verdict.reason) == ("fail", checks.TIMEOUT), verdict.to_dict()
    assert _no_children_left()  # the worker's process group was killed


def test_kernel_that_segfaults_is_reported_as_crashed(kernel_session: Session) -> None:
    verdict = _verify(kernel_session, _external("segfault.c"))
    assert (verdict.status, verdict.reason) == ("fail", checks.CRASHED), verdict.to_dict()
    assert "signal" in verdict.message
    assert _no_children_left()


# -- the CLI ---------------------------------------------------------------------------------

def _listed(home: Path, op: str) -> dict[str, str]:
    """impl name -> verified status, from `strata kernels list OP -o json`."""
    run = run_cli("kernels", "list", op, "-o", "json", home=home)
    assert run.returncode == 0, run.stderr
    return {r["impl"]: r["verified"] for r in json.loads(run.stdout)}


def test_cli_add_rejects_a_cheat_and_registers_an_honest_kernel(strata_home: Path) -> None:
    cheat = run_cli("kernels", "add", str(ADVERSARIAL / "first_seed_only.c"), "--no-bench",
                    home=strata_home)
    assert cheat.returncode == 1, cheat.stdout + cheat.stderr
    assert checks.WRONG_RESULT in cheat.stdout + cheat.stderr
    honest = run_cli("kernels", "add", str(ADVERSARIAL / "honest_rmsnorm.c"), "--no-bench",
                     home=strata_home)
    assert honest.returncode == 0, honest.stdout + honest.stderr
    listed = _listed(strata_home, "rmsnorm")
    assert listed["c.ext.honest_rmsnorm"] == "pass"
    assert listed.get("c.ext.first_seed_only") != "pass"


def test_cli_add_static_rejection_names_the_reason(strata_home: Path) -> None:
    run = run_cli("kernels", "add", str(ADVERSARIAL / "calls_torch.py"), "--no-bench",
                  home=strata_home)
    assert run.returncode == 1, run.stdout + run.stderr
    assert checks.STATIC_CHECK in run.stdout + run.stderr
    assert "triton.ext.calls_torch" not in _listed(strata_home, "silu_mul")


def test_cli_kernel_rejected_at_runtime_is_not_registered(strata_home: Path) -> None:
    run = run_cli("kernels", "add", str(ADVERSARIAL / "first_seed_only.c"), "--no-bench",
                  home=strata_home)
    assert run.returncode == 1
    assert "c.ext.first_seed_only" not in _listed(strata_home, "rmsnorm")


def test_the_fixed_width_cheat_wins_where_every_shape_has_k_4() -> None:
    """Write the cheat, watch it win, close the class: unrolled for K = 4 it matches the
    reference at every Mamba shape (all K = 4), so a verify set of those alone would pass it;
    the op's verify set and its ragged clause hold K = 2 and 3, where it is wrong (and the
    sandboxed verification above rejects it)."""
    import torch

    from strata.kernels.dialects.c import load_c
    from strata.kernels.spec import get_spec

    spec = get_spec("conv1d_causal")
    kernel = load_c(_external("conv_fixed_width.c"), spec, "cpu")

    def error(shape: dict[str, int]) -> Any:
        inputs = spec.make_inputs(shape, "float32", 0, "cpu")
        out = torch.full(spec.out_shape(shape), float("nan"))
        kernel.bind(out, inputs, {})()
        ref = spec.reference(*[t.double() for t in inputs])
        return checks.compare(out, ref, spec.tolerance("float32"))

    assert all(error(s) is None for s in spec.shapes["llm"] + spec.shapes["serve"])  # it wins
    shown = [s for s in spec.shapes["verify"] if s["K"] != 4]
    assert shown and all(error(s) is not None for s in shown)  # the class, closed


def _conv2d_error(kernel: Any, shape: dict[str, int], symmetric: bool = False) -> Any:
    """The cheat's failure at `shape` against the float64 reference (None: it passes)."""
    import torch

    from strata.kernels.spec import get_spec

    spec = get_spec("conv2d_nhwc")
    inputs = spec.make_inputs(shape, "float32", 0, "cpu")
    if symmetric:  # filters equal to their own transpose over (kh, kw)
        inputs[1] = ((inputs[1] + inputs[1].transpose(1, 2)) / 2).contiguous()
    out = torch.full(spec.out_shape(shape), float("nan"))
    kernel.bind(out, inputs, {})()
    ref = spec.reference(*[t.double() if t.is_floating_point() else t for t in inputs])
    return checks.compare(out, ref, spec.tolerance("float32"))


def _small(shape: dict[str, int]) -> dict[str, int]:
    """A published layer's geometry (K, S, P, G) at a size the plain-C cheats finish fast."""
    return {**shape, "H": min(shape["H"], 2 * shape["K"] + 3),
            "W": min(shape["W"], 2 * shape["K"] + 3), "C": min(shape["C"], 8),
            "O": min(shape["O"], 8), "G": 1 if shape["G"] == 1 else min(shape["C"], 8)}


def test_the_conv2d_stride_cheat_wins_where_every_layer_has_stride_one() -> None:
    """Write the cheat, watch it win, close the class: ignoring the stride is right at every
    stride-1 published layer (most of ResNet-50 and the depthwise convs), so a verify set of
    those alone would pass it; the op's verify set and its stride clause hold S = 2 and 4."""
    from strata.kernels.dialects.c import load_c
    from strata.kernels.spec import get_spec

    spec = get_spec("conv2d_nhwc")
    kernel = load_c(_external("conv2d_stride_one.c"), spec, "cpu")
    ones = [_small(s) for s in spec.shapes["llm"] if s["S"] == 1]
    assert len(ones) >= 5 and all(_conv2d_error(kernel, s) is None for s in ones)  # it wins
    shown = [s for s in spec.shapes["verify"] if s["S"] > 1 and s["H"] > s["K"]]
    assert shown and all(_conv2d_error(kernel, s) is not None for s in shown)  # closed


def test_the_transposed_filter_cheat_wins_on_symmetric_filters() -> None:
    """Symmetric test filters hide a kernel that reads w[o, kw, kh] for w[o, kh, kw]: with
    them it passes at every K > 1 verify shape; with the verifier's random filters it fails
    at each of them."""
    from strata.kernels.dialects.c import load_c
    from strata.kernels.spec import get_spec

    spec = get_spec("conv2d_nhwc")
    kernel = load_c(_external("conv2d_weights_transposed.c"), spec, "cpu")
    shapes = [s for s in spec.shapes["verify"] if s["K"] > 1]
    assert all(_conv2d_error(kernel, s, symmetric=True) is None for s in shapes)  # it wins
    assert all(_conv2d_error(kernel, s) is not None for s in shapes)  # the class, closed
