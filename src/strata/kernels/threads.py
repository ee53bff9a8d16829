"""Thread counts for verification calls: a data race shows as a result that changes with
the number of threads, so the verifier calls each case on one thread, the default team and
an oversubscribed team (C kernels: the OpenMP runtime they link, libgomp; its thread-count
setting is per calling thread, so torch's own bundled OpenMP is unaffected)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
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
