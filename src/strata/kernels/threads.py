"""Thread counts for verification calls: a data race shows as a result that changes with
the number of threads, so the verifier calls each case on one thread, the default team and
an oversubscribed team (C kernels: the OpenMP runtime they link, libgomp; its thread-count
setting is per calling thread, so torch's own bundled OpenMP is unaffected)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

OPENMP_DIALECTS = ("c",)


@dataclass
class ThreadControl:
    lib: Any = None  # libgomp, where the dialect uses OpenMP
    default: int = 1

    @property
    def active(self) -> bool:
        return self.lib is not None

    @classmethod
    def for_dialect(cls, dialect: str) -> ThreadControl:
        if dialect not in OPENMP_DIALECTS:
            return cls()
        try:
            lib = ctypes.CDLL("libgomp.so.1")
        except OSError:
            return cls()
        return cls(lib, int(lib.omp_get_max_threads()))

    def oversubscribed(self) -> int | None:
        """More threads than cores, so the work is split differently than by default."""
        return 2 * max(self.default, os.cpu_count() or 1) + 1 if self.active else None

    @contextmanager
    def limit(self, n: int | None) -> Iterator[None]:
        if not self.active or n is None:
            yield
            return
        self.lib.omp_set_num_threads(int(n))
        try:
            yield
        finally:
            self.lib.omp_set_num_threads(self.default)


@dataclass
class OpenRegions:
    """libgomp's view of the calling thread: how deep in parallel regions it is, and the
    way out of one (the end of the region joins its team)."""

    level: Callable[[], int]
    end: Callable[[], None]

    def close(self) -> int:
        """Join every region the kernel left open (so its team stops writing into buffers
        the judge is about to reuse or unmap); return how many there were."""
        n = depth = int(self.level())
        while depth > 0:
            self.end()
            depth = int(self.level())
            if depth >= n:  # not ours to end (cannot happen on a plain harness thread)
                break
        return n


def open_regions() -> OpenRegions | None:
    """libgomp where the process has it loaded (a C kernel linked it), else None. Its
    level, read on the thread that called a kernel right after it returned: above 0
    means the kernel returned inside a parallel region it opened (GOMP_parallel_start
    without GOMP_parallel_end), so its team may still be computing after "done". Unlike
    sampling the output or the worker's CPU, this does not race the team."""
    try:
        lib = ctypes.CDLL("libgomp.so.1", mode=getattr(os, "RTLD_NOLOAD", 4))
    except OSError:
        return None
    level, end = lib.omp_get_level, lib.GOMP_parallel_end
    level.restype, level.argtypes = ctypes.c_int, []
    end.restype, end.argtypes = None, []
    return OpenRegions(level, end)
