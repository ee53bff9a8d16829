"""The sandbox's settings: a worker's time and memory limits, its environment (every cache
pointed at its private scratch directory) and what a GPU worker may execute. The worker
itself is started by kernels/process.py; untrusted kernels never run in this process
(docs/architecture.md §7)."""

from __future__ import annotations

import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from strata.kernels.confine import scratch_env
from strata.launch import Limits
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


# OpenMP threads spin after a parallel region before they sleep; libgomp's default count
# (300000 pauses) keeps a core busy for tens of ms on a VM where a pause traps. The judge
# reads a worker's CPU while it idles (work after return shows there), so workers spin
# briefly: back-to-back regions inside a call still find their team awake.
SPIN_COUNT = "1000"


def worker_env(device: str, scratch: Path | None = None) -> dict[str, str]:
    env = base_env()
    env["GOMP_SPINCOUNT"] = SPIN_COUNT
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
