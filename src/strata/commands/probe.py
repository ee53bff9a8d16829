"""`strata probe`: probe, optionally measure, store, and hand back what to print.

`--measure` on a busy host (other processes using the CPUs, HostLoadMonitor) measures again,
up to MEASURE_ATTEMPTS times, keeping each figure's best; when every attempt was busy the
roofline is known to be low and is not stored unless `allow_busy` (--allow-busy) says so.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from strata.hardware.microbench import measure_host
from strata.hardware.probe import probe_host
from strata.hardware.profile import HostProfile
from strata.host import BUSY_PAUSE_S, MEASURE_ATTEMPTS, busy_refusal, measure_until_quiet
from strata.measure.peak import trust_lines
from strata.measure.roofline import Roofline
from strata.store.hosts import latest_measurement, save_host, save_measurement

__all__ = ["BUSY_PAUSE_S", "MEASURE_ATTEMPTS", "ProbeResult", "busy_refusal", "measure_until_quiet",
           "run_probe"]



@dataclass
class ProbeResult:
    profile: HostProfile
    fingerprint: str
    roofline: Roofline | None
    roofline_is_new: bool
    telemetry: dict[str, Any] | None = None
    refused: str | None = None  # why a measured roofline was not stored (a busy host)

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "profile": self.profile.to_dict(),
                "roofline": self.roofline.to_dict() if self.roofline else None,
                "roofline_measured_now": self.roofline_is_new,
                "roofline_stored": self.roofline_is_new and self.refused is None,
                "roofline_refused": self.refused, "telemetry": self.telemetry}

    def render(self, console: Console) -> None:
        from strata.views.probe import render_profile, render_roofline

        render_profile(console, self.profile)
        if self.roofline is None:
            console.print("[dim]no roofline stored for this host: run `strata probe --measure`"
                          "[/dim]")
            return
        if self.refused:
            console.print("[yellow]measured on a busy host and NOT stored:[/yellow]")
        elif not self.roofline_is_new:
            console.print("[dim]stored roofline for this host (re-measure with --measure):"
                          "[/dim]")
        render_roofline(console, self.roofline)
        for line in trust_lines(self.roofline):
            console.print(line, highlight=False, markup=False)


def run_probe(conn: sqlite3.Connection, measure: bool, smoke: bool, smoke_timeout_s: float,
              console: Console, allow_busy: bool = False,
              measurer: Callable[[HostProfile, Callable[[str], None]], Roofline] | None = None,
              pause_s: float = BUSY_PAUSE_S) -> ProbeResult:
    """measurer(profile, progress) -> Roofline: one attempt (default measure_host); tests
    pass recorded measurements, since a busy host cannot be arranged to order."""
    attempt = measurer or (lambda profile, say: measure_host(profile, progress=say))
    with console.status("probing…") as status:
        profile = probe_host(smoke=smoke, smoke_timeout_s=smoke_timeout_s,
                             progress=lambda m: status.update(f"probing: {m}"))
        fingerprint = save_host(conn, profile)
        if measure:
            roofline = measure_until_quiet(
                lambda say: attempt(profile, say),
                lambda m: status.update(f"measuring: {m}"), pause_s=pause_s)
            if roofline.measured_busy and not allow_busy:
                return ProbeResult(profile, fingerprint, roofline, True,
                                   refused=busy_refusal(roofline))
            save_measurement(conn, fingerprint, "roofline", roofline.to_dict())
            return ProbeResult(profile, fingerprint, roofline, True)
    stored = latest_measurement(conn, fingerprint, "roofline")
    return ProbeResult(profile, fingerprint, Roofline.from_dict(stored) if stored else None,
                       False)


def run_watch(conn: sqlite3.Connection, fingerprint: str, seconds: float, interval_s: float,
              console: Console) -> dict[str, Any]:
    """Live telemetry for `seconds`; the summary is stored with the host and returned."""
    from strata.hardware.watch import watch

    data = watch(seconds, interval_s, console).to_dict()
    save_measurement(conn, fingerprint, "telemetry", data)
    return data
