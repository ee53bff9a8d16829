"""One thread team per process, one default: torch's intra-op pool and the OpenMP runtime the
lab's C kernels link (libgomp), both sized here.

The default is what the user asked the environment for (OMP_NUM_THREADS, which torch and
libgomp each read on their own) or else the probe's physical cores: hyperthreads share a
core's vector units, so a second team member per core only contends. Sizing both teams from
one number matters because libgomp's own default is every logical CPU, which oversubscribes
the cores torch's pool already uses.
"""

from __future__ import annotations

import os

from strata.errors import InputError


def default_threads() -> int:
    """OMP_NUM_THREADS when set to a positive count, else the physical cores (the probe's;
    os.cpu_count() where the probe cannot tell)."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    from strata.hardware.cpu import probe_cpu

    return probe_cpu().physical_cores or os.cpu_count() or 1


def set_threads(threads: int | None = None) -> int:
    """Size torch's team and the lab's OpenMP team to `threads` (None: `default_threads()`);
    returns the count used. Process-wide state, so callers set it on every load or run rather
    than only when asked. libgomp's count is per calling thread: call it from the thread that
    runs the kernels."""
    import torch

    from strata.kernels.threads import ThreadControl

    if threads is None:
        threads = default_threads()
    if threads < 1:
        raise InputError(f"--threads {threads}: must be at least 1")
    control = ThreadControl.for_dialect("c")
    if control.active:
        control.lib.omp_set_num_threads(int(threads))
    torch.set_num_threads(int(threads))
    return int(threads)
