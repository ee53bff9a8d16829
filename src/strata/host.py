"""This host, for every command and library call: its profile (probed once per process),
its fingerprint in the results DB, its roofline (loaded, or measured and stored) and the
keeper that re-measures a peak a later result beats. Commands and `strata.kernels.get` go
through here instead of probing, or importing each other, on their own.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

MEASURE_ATTEMPTS = 3  # a busy host gets this many tries at a quiet moment
BUSY_PAUSE_S = 5.0  # between tries: a burst of other work (a compile, an update) may end

if TYPE_CHECKING:
    from strata.hardware.profile import HostProfile
    from strata.kernels.capability import HostCaps
    from strata.measure.peakguard import PeakKeeper
    from strata.measure.roofline import Roofline


@lru_cache(maxsize=1)
def _profile() -> HostProfile:
    """The probe (no smoke test) once per process: a host does not change under a command."""
    from strata.hardware.probe import probe_host

    return probe_host(smoke=False)


Measure = Callable[[Callable[[str], None]], "Roofline"]


def measure_until_quiet(measure: Measure, say: Callable[[str], None],
                        attempts: int = MEASURE_ATTEMPTS,
                        pause_s: float = BUSY_PAUSE_S) -> Roofline:
    """Measure; while the host was busy, wait and measure again (up to `attempts`), each
    figure the best over the attempts. Roofline.measured_busy: no attempt was quiet."""
    from strata.measure.peak import merge_roofline

    roof = measure(say)
    for attempt in range(2, attempts + 1):
        if not roof.measured_busy:
            break
        say(f"{roof.host_load[-1]['verdict']}: measuring again ({attempt} of {attempts})")
        time.sleep(pause_s)
        roof = merge_roofline(roof, measure(say), "best over attempts on a busy host")
    return roof


def busy_refusal(roof: Roofline) -> str:
    load = roof.host_load[-1] if roof.host_load else {}
    share = max((h.get("busy_share") or 0.0) for h in roof.host_load) if roof.host_load else 0
    return (f"roofline not stored: the host was busy in all {len(roof.host_load)} attempts "
            f"(other processes used up to {share:.0%} of the CPUs; last: "
            f"{load.get('verdict', '?')}), so these peaks are known to be low and would "
            "understate every ceiling. Re-run `strata probe --measure` on a quiet host, or add "
            "--allow-busy to store them flagged as measured on a busy host")


@dataclass
class Host:
    conn: sqlite3.Connection
    profile: HostProfile
    fingerprint: str
    _unstored: Roofline | None = field(default=None, init=False, repr=False)  # a busy one

    @cached_property
    def caps(self) -> HostCaps:
        """What the kernel lab may use here (devices, ISA, tools)."""
        from strata.kernels.capability import host_caps

        return host_caps(self.profile)

    def roofline(self, console: Console) -> Roofline:
        """The stored roofline; measured first (and stored) if the host has none.

        The busy-host rule, the same as `strata probe --measure`'s (README, "Roofline"):
        measure, and while other processes keep the host busy wait and measure again
        (measure_until_quiet); a roofline still busy after every attempt is NOT stored — its
        peaks are known to be low and would understate every later ceiling. This process
        uses it (flagged, said on stderr); the next command measures again, and `strata
        probe --measure --allow-busy` stores a busy one on purpose."""
        from strata.hardware.microbench import measure_host
        from strata.measure.roofline import Roofline
        from strata.store.hosts import latest_measurement, save_measurement

        if self._unstored is not None:
            return self._unstored
        stored = latest_measurement(self.conn, self.fingerprint, "roofline")
        if stored:
            return Roofline.from_dict(stored)
        console.print("no roofline stored for this host yet: measuring it once "
                      "(strata probe --measure)…")
        with console.status("measuring roofline…") as status:
            roof = measure_until_quiet(
                lambda say: measure_host(self.profile, progress=say),
                lambda m: status.update(f"measuring: {escape(m)}"))
        if roof.measured_busy:
            console.print(f"[yellow]{escape(busy_refusal(roof))}; this run uses it, flagged"
                          "[/yellow]")
            self._unstored = roof
            return roof
        save_measurement(self.conn, self.fingerprint, "roofline", roof.to_dict())
        return roof

    def peak_keeper(self, roof: Roofline) -> PeakKeeper:
        """Re-measures a peak that a result beats by > 5% and stores the corrected roofline."""
        from strata.hardware.microbench import host_remeasure
        from strata.measure.peakguard import PeakKeeper
        from strata.store.hosts import save_measurement

        return PeakKeeper(roof, host_remeasure(self.profile),
                          save=lambda r: save_measurement(self.conn, self.fingerprint,
                                                          "roofline", r.to_dict()))


def this_host(conn: sqlite3.Connection, console: Console | None = None) -> Host:
    """This host's profile (probed once per process) and its fingerprint, stored in `conn`."""
    from strata.hardware.support import keep_smoke_verdicts
    from strata.store.hosts import load_host, save_host

    if console is None:
        profile = _profile()
    else:
        with console.status("probing host…"):
            profile = _profile()
    # probed without the smoke test: keep what `strata probe` learned about each device
    keep_smoke_verdicts(profile, load_host(conn, profile.fingerprint()))
    return Host(conn, profile, save_host(conn, profile))
