"""The Sampler: a background thread that reads every registered reader each interval."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from strata.hardware.telemetry.readers import (
    READERS,
    Reader,
    ReaderContext,
    ReaderFactory,
    SourceUnavailable,
)
from strata.hardware.telemetry.readers.base import _describe
from strata.hardware.telemetry.samples import (
    DEFAULT_INTERVAL_S,
    MIN_INTERVAL_S,
    Readings,
    Sample,
)
from strata.hardware.telemetry.summary import TelemetrySummary, summarize


class Sampler:
    """Background thread that samples every available reader every `interval_s`.

    Readers are opened in start() on the caller's thread, so `unavailable` is complete as
    soon as start() returns; reads happen on the sampler thread. A Sampler runs once.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        readers: Mapping[str, ReaderFactory] | None = None,
        sysfs_root: Path | str = "/sys",
        procfs_root: Path | str = "/proc",
        pid: int | None = None,
    ) -> None:
        if not interval_s >= MIN_INTERVAL_S:
            raise ValueError(f"interval_s must be >= {MIN_INTERVAL_S} s, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._factories = dict(READERS if readers is None else readers)
        self._ctx = ReaderContext(Path(sysfs_root), Path(procfs_root), pid or os.getpid())
        self._active: dict[str, Reader] = {}
        self._closed: dict[str, Reader] = {}  # kept after stop for `dropped` and `source`
        self._disabled: dict[str, str] = {}
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Sampler:
        if self._thread is not None:
            raise RuntimeError("a Sampler runs once; create a new one for another run")
        for name, factory in self._factories.items():
            self._open(name, factory)
        self._thread = threading.Thread(target=self._run, name="strata-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Take a last sample, join the thread and release the readers. Idempotent."""
        thread = self._thread
        if thread is None or (not thread.is_alive() and not self._active):
            return  # never started, or already stopped
        self._stop.set()
        thread.join(timeout=max(5.0, 10 * self.interval_s))
        if thread.is_alive():
            # A reader is stuck in the kernel or a driver: do not close what it is using.
            self._disabled["sampler"] = "sampler thread did not stop; a reader is hanging"
            return
        for name in list(self._active):
            self._close(name)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- results

    @property
    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    def latest(self) -> Sample | None:
        with self._lock:
            return self._samples[-1] if self._samples else None

    @property
    def unavailable(self) -> dict[str, str]:
        """reader (or reader.field) -> why it gives no readings here."""
        out = dict(self._disabled)
        for name, reader in list(self._active.items()) + list(self._closed.items()):
            out.update({f"{name}.{k}": v for k, v in dict(reader.dropped).items()})
        return out

    @property
    def sources(self) -> dict[str, str]:
        """reader -> where its readings come from, for readers that worked."""
        readers = list(self._active.items()) + list(self._closed.items())
        return {name: r.source for name, r in readers if name not in self._disabled}

    def summary(self) -> TelemetrySummary:
        return summarize(self.samples, self.interval_s, self.unavailable, self.sources)

    def to_dict(self, include_samples: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"summary": self.summary().to_dict()}
        if include_samples:
            out["samples"] = [s.to_dict() for s in self.samples]
        return out

    # -- internals

    def _open(self, name: str, factory: ReaderFactory) -> None:
        try:
            reader = factory(self._ctx)
            reader.open()
        except SourceUnavailable as exc:
            self._disabled[name] = str(exc)
            return
        except Exception as exc:  # a broken reader must never stop the sampler
            self._disabled[name] = f"open failed: {_describe(exc)}"
            return
        self._active[name] = reader

    def _close(self, name: str) -> None:
        reader = self._active.pop(name)
        self._closed[name] = reader
        try:
            reader.close()
        except Exception as exc:
            reader.dropped["close"] = _describe(exc)

    def _take_sample(self) -> None:
        t_ns = time.perf_counter_ns()
        readings: Readings = {}
        for name, reader in list(self._active.items()):
            try:
                readings.update(reader.read())
            except Exception as exc:  # disable once, keep the reason, keep sampling
                self._disabled[name] = f"read failed: {_describe(exc)}"
                self._close(name)
        with self._lock:
            self._samples.append(Sample(t_ns, readings))

    def _run(self) -> None:
        next_t = time.perf_counter()
        while True:
            self._take_sample()
            next_t += self.interval_s
            delay = next_t - time.perf_counter()
            if delay < 0:  # a slow read overran the interval: skip ticks, never burst
                next_t, delay = time.perf_counter(), 0.0
            if self._stop.wait(delay):
                break
        self._take_sample()  # at stop, so counters and energy cover the whole run
