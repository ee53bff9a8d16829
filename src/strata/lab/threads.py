"""One thread team per process: the lab's C kernels (OpenMP, libgomp) and torch's glue
both sized from the probe (physical cores) unless `-t` says otherwise."""

from __future__ import annotations

import torch

from strata.errors import InputError
from strata.kernels.threads import ThreadControl


def set_threads(threads: int | None) -> int:
    """Set both teams; returns the count used. Process-wide state: set on every load."""
    if threads is None:
        from strata.hardware.cpu import probe_cpu

        threads = probe_cpu().physical_cores or torch.get_num_threads()
    if threads < 1:
        raise InputError(f"--threads {threads}: must be at least 1")
    control = ThreadControl.for_dialect("c")
    if control.active:
        control.lib.omp_set_num_threads(int(threads))
    torch.set_num_threads(threads)
    return threads
