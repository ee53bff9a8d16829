"""Untrusted kernels in production: a kernel that did not ship with strata runs in its own
confined worker when dispatch serves it (strata.kernels.get, -B lab, train), through shared
memory — never in the caller's process — unless the user trusts it by name. Each escape
fixture is shown acting when loaded in-process the way dispatch loaded kernels before (in a
child process of the test), and held when served the way dispatch serves it now."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from strata.kernels import Choice
from strata.kernels.dispatch import Decision
from strata.kernels.impl import Implementation, from_source
from strata.kernels.spec import get_spec
from tests.conftest import FIXTURES, run_cli

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # workers and sandboxes are processes importing torch

ADVERSARIAL = FIXTURES / "kernels" / "adversarial"
ESCAPES = "/tmp/strata_escape_*"


def _escaped() -> list[str]:
    return glob.glob(ESCAPES)


@pytest.fixture(autouse=True)
def _no_escape_files() -> Any:
    for leftover in _escaped():
        os.remove(leftover)
    yield
    for leftover in _escaped():
        os.remove(leftover)


def _external(name: str) -> Implementation:
    return from_source(ADVERSARIAL / name, origin="external")


def _served(impl: Implementation, kernel_session: Any) -> Choice:
    """The Choice dispatch returns when it picks `impl` (untrusted: confined)."""
    return Choice(Decision(impl.op, "cpu", "kernel", impl, confined=True),
                  get_spec(impl.op), caps=kernel_session.caps)


def _rmsnorm_inputs() -> tuple[Any, Any, Any]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4096, generator=gen)
    w = torch.randn(4096, generator=gen)
    return torch.empty(8, 4096), x, w


def _in_process_escapes(name: str, op: str) -> list[str]:
    """What the fixture did when loaded into a process the way dispatch loaded kernels
    before this change: the dialect's loader in the caller's interpreter (run in a child
    here, so the test process stays clean)."""
    code = f"""
import json, pathlib, torch
from strata.kernels.dialects import get_dialect
from strata.kernels.impl import from_source
from strata.kernels.spec import get_spec
impl = from_source(pathlib.Path({str(ADVERSARIAL / name)!r}), origin="external")
spec = get_spec({op!r})
inputs = spec.make_inputs(spec.shapes["verify"][-1], "float32", 0, "cpu")
out = torch.empty(spec.out_shape(spec.shapes["verify"][-1]))
get_dialect(impl.dialect).load(impl, spec, "cpu").bind(out, inputs, spec.params_for(
    spec.shapes["verify"][-1]))()
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"),
           "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, "-c", code], env=env, check=False, timeout=300,
                   capture_output=True)
    found = _escaped()
    for path in found:
        os.remove(path)
    return found


def test_an_untrusted_kernel_runs_in_its_own_process_and_computes_right(
        kernel_session: Any) -> None:
    choice = _served(_external("honest_rmsnorm.c"), kernel_session)
    out, x, w = _rmsnorm_inputs()
    choice(out, x, w, eps=1e-6)
    ref = get_spec("rmsnorm").reference(x.double(), w.double(), 1e-6)
    assert (out.double() - ref).abs().max() < 1e-4
    worker = choice._kernel.proc.proc
    assert worker.pid != os.getpid() and worker.poll() is None
    assert choice._kernel.proc.sandbox["level"].startswith(("landlock", "seccomp"))
    # a bound call (the lab's decode) moves the storages to shared memory once, in place
    thunk = choice.bound(out, x, w, eps=1e-6)
    x.mul_(3.0)  # the caller writes its buffer; the worker sees the new values
    thunk()
    ref = get_spec("rmsnorm").reference(x.double(), w.double(), 1e-6)
    assert x.is_shared() and (out.double() - ref).abs().max() < 1e-4
    choice.close()
    assert worker.poll() is not None


def test_bound_calls_on_fresh_tensors_of_growing_size_stay_right(kernel_session: Any) -> None:
    """A prefill binds new activations each chunk: the heap block a storage left when it
    moved to shared memory is soon another tensor's, which must not be taken for the old
    (mapped, smaller) segment; storages the caller dropped are unmapped."""
    choice = _served(_external("honest_rmsnorm.c"), kernel_session)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(576, generator=gen)
    for i in range(60):
        rows = 1 + (i % 7) * 3
        x, out = torch.randn(rows, 576, generator=gen), torch.empty(rows, 576)
        choice.bound(out, x, w, eps=1e-6)()
        ref = get_spec("rmsnorm").reference(x.double(), w.double(), 1e-6)
        assert (out.double() - ref).abs().max() < 1e-4, i
    assert len(choice._kernel.shared) <= 4  # w and the last x/out (and their thunk's)
    choice.close()


def test_an_elf_lookup_escape_acts_in_process_and_is_held_when_served(
        kernel_session: Any) -> None:
    """The kernel finds open/write through libc's ELF tables from an allowed import (no
    forbidden import for elfcheck to see) and writes a file when it can: inside a process
    it escapes; served confined, Landlock refuses the write, and the output is right."""
    assert _in_process_escapes("elf_lookup.c", "rmsnorm") == ["/tmp/strata_escape_elf_lookup"]
    choice = _served(_external("elf_lookup.c"), kernel_session)
    out, x, w = _rmsnorm_inputs()
    for _ in range(3):
        choice(out, x, w, eps=1e-6)
    ref = get_spec("rmsnorm").reference(x.double(), w.double(), 1e-6)
    assert (out.double() - ref).abs().max() < 1e-4
    choice.close()
    assert _escaped() == []


def test_a_launcher_that_acts_only_outside_the_sandbox_is_held_when_served(
        kernel_session: Any) -> None:
    """A Triton launcher that behaves in the sandbox and writes a file once it is loaded
    anywhere else: served confined, it is still in a sandbox."""
    pytest.importorskip("triton")
    escaped = _in_process_escapes("production_action.py", "silu_mul")
    assert escaped == ["/tmp/strata_escape_production"]
    impl = _external("production_action.py")
    choice = _served(impl, kernel_session)
    spec = get_spec("silu_mul")
    a, b = spec.make_inputs({"rows": 2, "cols": 64}, "float32", 0, "cpu")
    out = torch.empty(2, 64)
    choice(out, a, b)
    assert (out - spec.reference(a, b)).abs().max() < 1e-5
    choice.close()
    assert _escaped() == []


def test_dispatch_serves_an_added_kernel_confined_through_kernels_get(
        strata_home: Path) -> None:
    """The whole door: `kernels add` (verify + bench) and `strata.kernels.get` in this
    process. Whatever dispatch picks, no file appears; when it picks the escape kernel
    (it is a fast honest rmsnorm), its calls run in a confined worker."""
    import strata.kernels as lab

    run = run_cli("kernels", "add", str(ADVERSARIAL / "elf_lookup.c"), home=strata_home,
                  timeout=900)
    assert run.returncode in (0, 1), run.stderr
    choice = lab.get("rmsnorm", db=strata_home / "strata.db")
    out, x, w = _rmsnorm_inputs()
    choice(out, x, w, eps=1e-6)
    if choice.decision.impl is not None and choice.decision.impl.origin == "external":
        assert choice.confined and choice._kernel.proc.proc.pid != os.getpid()
        choice.close()
    assert _escaped() == []
    listed = json.loads(run_cli("kernels", "list", "rmsnorm", "-o", "json",
                                home=strata_home).stdout)
    assert {r["impl"] for r in listed} >= {"c.avx2"}
