"""The reader contract, the registry, and the file helpers the readers share.

A reader is one small, optional telemetry source (cpufreq, hwmon, RAPL, NVML, ...) that
registers itself by name with `register_reader`. A reader that cannot work here raises
`SourceUnavailable` from open(); the Sampler keeps the reason (docs/architecture.md §5 "Honesty").
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from strata.hardware.telemetry.samples import Readings


class SourceUnavailable(Exception):
    """Raised by a reader's open() when its source does not exist or cannot be read here."""


@dataclass(frozen=True)
class ReaderContext:
    """Where readers look. Roots are parameters so tests can point them at fake trees."""

    sysfs_root: Path = Path("/sys")
    procfs_root: Path = Path("/proc")
    pid: int = field(default_factory=os.getpid)


class Reader:
    """One telemetry source.

    open() prepares and raises SourceUnavailable (or anything else) if the source cannot
    work here; read() returns the current readings; close() releases what open() took.
    `source` says where readings come from; `dropped` names single fields that stopped
    working while the rest of the reader still does (field -> reason).
    """

    name: ClassVar[str] = ""

    def __init__(self, ctx: ReaderContext) -> None:
        self.ctx = ctx
        self.source = ""
        self.dropped: dict[str, str] = {}

    def open(self) -> None:
        """Check the source exists; raise SourceUnavailable with the reason if not."""

    def read(self) -> Readings:
        raise NotImplementedError

    def close(self) -> None:
        """Release what open() acquired (library handles)."""


ReaderFactory = Callable[[ReaderContext], Reader]

READERS: dict[str, ReaderFactory] = {}


def register_reader(cls: type[Reader]) -> type[Reader]:
    """Class decorator: make a reader available to every Sampler under `cls.name`."""
    READERS[cls.name] = cls
    return cls


def _read_text(path: Path) -> str:
    return path.read_text().strip()


def _read_float(path: Path) -> float:
    return float(_read_text(path))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Fields:
    """Named zero-argument getters; a getter that raises is dropped once with its reason.

    One unsupported query (energy on an older GPU, a thermal zone that returns EINVAL)
    must not cost the other readings of the same device.
    """

    def __init__(self, getters: Mapping[str, Callable[[], float]], dropped: dict[str, str]):
        self._getters = dict(getters)
        self._dropped = dropped

    def __bool__(self) -> bool:
        return bool(self._getters)

    def read(self) -> Readings:
        out: Readings = {}
        for key, get in list(self._getters.items()):
            try:
                out[key] = get()
            except Exception as exc:  # any failure of one field: drop it, keep the rest
                del self._getters[key]
                self._dropped[key] = _describe(exc)
        return out


def _file_getter(path: Path, scale: float = 1.0) -> Callable[[], float]:
    return lambda: _read_float(path) * scale


def _first_readable(paths: Iterable[Path]) -> tuple[list[Path], dict[str, str]]:
    """Split paths into those whose first read parses as a number and the failures
    (keyed by the parent directory's name, e.g. the RAPL zone)."""
    good: list[Path] = []
    bad: dict[str, str] = {}
    for p in paths:
        try:
            _read_float(p)
            good.append(p)
        except Exception as exc:
            bad[p.parent.name] = _describe(exc)
    return good, bad


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text.strip()) or "unnamed"
