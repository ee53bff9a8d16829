"""Shared memory between the judge and a kernel's worker: every buffer a kernel call reads or
writes lives in a memfd segment that both processes map.

The judge (this process) allocates segments and makes torch tensors over them (`Arena`); the
worker maps the same pages (`Mapping`) and hands the kernel pointers into them. Inputs of
production calls are mapped read-only in the worker (the descriptor reopened O_RDONLY, so no
mprotect can make them writable): a confined kernel cannot change a model's weights.
"""

from __future__ import annotations

import itertools
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

_IDS = itertools.count(1)


@dataclass
class Segment:
    """One memfd and this process's read-write mapping of it."""

    id: int
    fd: int
    nbytes: int
    mm: mmap.mmap
    address: int

    @classmethod
    def create(cls, nbytes: int, name: str = "strata-kernel") -> Segment:
        size = max(1, int(nbytes))
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            os.close(fd)
            raise
        return cls(next(_IDS), fd, size, mm, _address(mm))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _address(mm: mmap.mmap) -> int:
    import numpy as np

    return int(np.frombuffer(mm, dtype=np.uint8).ctypes.data)


@dataclass
class Arena:
    """Tensors over shared memory, one segment per allocation; `locate` finds the segment and
    byte offset of any tensor that lives in one (views included)."""

    segments: dict[int, Segment] = field(default_factory=dict)

    def empty(self, shape: tuple[int, ...] | list[int], dtype: Any) -> Any:
        import torch

        numel = 1
        for n in shape:
            numel *= int(n)
        item = torch.empty((), dtype=dtype).element_size()
        seg = Segment.create(numel * item)
        self.segments[seg.id] = seg
        flat = torch.frombuffer(seg.mm, dtype=torch.uint8, count=seg.nbytes)
        return flat[:numel * item].view(dtype).view(tuple(int(n) for n in shape))

    def copy(self, t: Any) -> Any:
        out = self.empty(tuple(t.shape), t.dtype)
        out.copy_(t)
        return out

    def locate(self, t: Any) -> tuple[Segment, int] | None:
        ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
        for seg in self.segments.values():
            if seg.address <= ptr and ptr + nbytes <= seg.address + seg.nbytes:
                return seg, ptr - seg.address
        return None

    def close(self) -> None:
        """Drop the descriptors (the pages live on while a tensor still maps them)."""
        for seg in self.segments.values():
            seg.close()
        self.segments.clear()


# -- the worker's side -------------------------------------------------------------------------

@dataclass
class Mapping:
    """A segment as the worker maps it: read-write, or read-only through a descriptor
    reopened O_RDONLY (the writable one is closed at once)."""

    mm: mmap.mmap
    address: int
    nbytes: int
    writable: bool

    @classmethod
    def open(cls, fd: int, nbytes: int, writable: bool) -> Mapping:
        if writable:
            use = fd
        else:
            use = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
            os.close(fd)
        try:
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mm = mmap.mmap(use, nbytes, mmap.MAP_SHARED, prot)
        finally:
            os.close(use)
        return cls(mm, _address(mm), nbytes, writable)
