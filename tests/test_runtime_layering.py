"""One device runtime: `torch.cuda/xpu/mps.synchronize` is reached only through
hardware/devices.py (`sync`, `Device.sync`) and the per-vendor runtime records it delegates to
(hardware/vendors/*.py). Everything else asks devices.py, so a ROCm, XPU or MPS device gets
its own vendor's sync rather than CUDA's, and the right device index rather than the current
one. Read from the AST: a call, a reference passed on (`HostClock(torch.cuda.synchronize)`),
an alias (`cuda = torch.cuda; cuda.synchronize()`), an import or a getattr all count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import strata

SRC = Path(strata.__file__).parent
RUNTIMES = ("cuda", "xpu", "mps")

# The device runtime itself.
ALLOWED = ("hardware/devices.py", "hardware/vendors/")
# Not a sync: the kernel guard reads the function object to notice a kernel that replaces it
# (an identity deny-list of timing objects, kernels/guards.py: timer_identities); it never
# calls it.
EXEMPT = {"kernels/guards.py": "identity deny-list of timing objects, never called"}


def _is_runtime(node: ast.expr) -> bool:
    """torch.cuda, self.torch.xpu, or a bare alias named cuda/xpu/mps."""
    if isinstance(node, ast.Attribute):
        return node.attr in RUNTIMES
    return isinstance(node, ast.Name) and node.id in RUNTIMES


def _reaches_sync(node: ast.AST) -> bool:
    """`<runtime>.synchronize`, `from torch.<runtime> import synchronize` or
    `getattr(<runtime>, "synchronize")`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "synchronize" and _is_runtime(node.value)
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[-1] in RUNTIMES and any(
            a.name == "synchronize" for a in node.names)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and len(node.args) >= 2
            and _is_runtime(node.args[0]) and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "synchronize")


def device_syncs(source: str) -> list[int]:
    """Line numbers where `source` reaches a torch runtime's synchronize."""
    return sorted(node.lineno for node in ast.walk(ast.parse(source)) if _reaches_sync(node))


@pytest.mark.parametrize(("source", "found"), [
    ("torch.cuda.synchronize()", True),
    ("torch.cuda.synchronize(device)", True),
    ("torch.xpu.synchronize(d)", True),
    ("torch.mps.synchronize()", True),
    ("self.torch.cuda.synchronize(self.device)", True),
    ("cuda = self.torch.cuda\ncuda.synchronize(self.device)", True),
    ("HostClock(torch.cuda.synchronize)", True),
    ("from torch.cuda import synchronize", True),
    ("getattr(torch.cuda, 'synchronize')()", True),
    ("end.synchronize()", False),  # a CUDA event's own wait, not the device's
    ("lc.llama_synchronize(ctx)", False),
    ("sync(device)", False),
    ("resolve(device).sync()", False),
])
def test_the_checker_sees_every_form(source: str, found: bool) -> None:
    assert bool(device_syncs(source)) is found


def test_device_sync_lives_only_in_the_device_runtime() -> None:
    offenders, runtime_hits = [], 0
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        hits = device_syncs(path.read_text(encoding="utf-8"))
        if rel.startswith(ALLOWED):
            runtime_hits += len(hits)
        elif hits and rel not in EXEMPT:
            offenders += [f"src/strata/{rel}:{line}" for line in hits]
    assert not offenders, ("torch device sync outside hardware/devices.py and "
                           f"hardware/vendors/ (call strata.hardware.devices.sync): {offenders}")
    assert runtime_hits >= len(RUNTIMES)  # the scan reads the runtime's own syncs


def test_the_exemptions_are_still_needed() -> None:
    """An exemption nobody needs any more would hide the next real offender there."""
    for rel, why in EXEMPT.items():
        assert device_syncs((SRC / rel).read_text(encoding="utf-8")), (rel, why)
