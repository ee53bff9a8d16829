"""Parent side of the sandbox: write a job, run the worker with a timeout and limits, read
its one result line. Untrusted kernels never run in this process (docs/architecture.md §7)."""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.hardware.smoke import error_summary
from strata.kernels import checks
from strata.kernels.confine import Plan, scratch_env
from strata.launch import IsolatedRun, Limits, run_isolated
from strata.launch import worker_env as base_env
from strata.paths import cache_dir

# Address-space limit for CPU jobs (GPU runtimes map huge virtual ranges, so they get none).
CPU_ADDRESS_SPACE = 16 << 30


@dataclass(frozen=True)
class SandboxPolicy:
    timeout_s: float = 120.0
    memory_bytes: int | None = CPU_ADDRESS_SPACE

    def limits(self, device: str) -> Limits:
        return Limits(cpu_seconds=int(max(60.0, 4 * self.timeout_s)),
                      address_space_bytes=self.memory_bytes if device == "cpu" else None)


def worker_env(device: str, scratch: Path | None = None) -> dict[str, str]:
    env = base_env()
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # Triton kernels run on CPU tensors, for correctness
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
    if scratch is not None:  # untrusted: every cache a library might write goes to scratch
        env.update(scratch_env(scratch))
    return env


def toolchain_dirs() -> tuple[str, ...]:
    """What a GPU worker may execute: Triton's bundled ptxas, the host compiler and the
    CUDA toolkit (Triton builds its launcher and compiles PTX on first use)."""
    dirs = [sysconfig.get_paths()["purelib"] + "/triton", "/usr/bin", "/usr/lib/gcc",
            "/usr/libexec/gcc", "/sbin/ldconfig", "/usr/sbin/ldconfig", "/usr/local/cuda"]
    for tool in ("nvcc", "ptxas", "cc", "gcc"):
        found = shutil.which(tool)
        if found:
            dirs.append(str(Path(found).resolve().parent.parent))
    return tuple(dict.fromkeys(dirs))


def run_job(job: dict[str, Any], policy: SandboxPolicy, trusted: bool = False) -> \
        dict[str, Any]:
    """The worker's result dict; a dead or silent worker becomes a failure with its reason.

    Untrusted jobs (anything that loads kernel code) get a private scratch directory, the
    only place they may write, and confine themselves before loading a kernel; `trusted`
    jobs (the torch baselines alone) keep the plain limits."""
    marker = f"STRATA-RESULT-{secrets.token_hex(8)}"
    scratch = Path(tempfile.mkdtemp(prefix="strata-ksandbox-"))
    path = scratch / "job.json"
    if not trusted:
        job = {**job, "confine": Plan(str(scratch), job["device"] != "cpu",
                                      toolchain_dirs()).to_job()}
    path.write_text(json.dumps({**job, "marker": marker}), "utf-8")
    try:
        run = run_isolated([sys.executable, "-m", "strata.kernels.worker", str(path)],
                           policy.timeout_s,
                           env=worker_env(job["device"], None if trusted else scratch),
                           limits=policy.limits(job["device"]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return parse_result(run, marker, policy.timeout_s)


def parse_result(run: IsolatedRun, marker: str, timeout_s: float) -> dict[str, Any]:
    for line in reversed(run.stdout.splitlines()):
        if line.startswith(marker + " "):
            return json.loads(line[len(marker) + 1:])
    if run.timed_out:
        failure = checks.Failure(checks.TIMEOUT, f"did not finish within {timeout_s:g} s "
                                 "(killed with its process group)")
    else:
        how = f"killed by signal {-run.returncode}" if (run.returncode or 0) < 0 else \
            f"exit code {run.returncode}"
        failure = checks.Failure(checks.CRASHED, f"the worker died ({how}): "
                                 f"{error_summary(run.stderr) or 'no error output'}",
                                 run.stderr.strip().splitlines()[-5:])
    return {"ok": False, "failure": failure.to_dict()}
