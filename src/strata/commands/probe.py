"""`strata probe`: probe, optionally measure, store, and hand back what to print."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from strata.hardware.microbench import measure_host
from strata.hardware.probe import probe_host
from strata.hardware.profile import HostProfile
from strata.measure.roofline import Roofline
from strata.store.hosts import latest_measurement, save_host, save_measurement


@dataclass
class ProbeResult:
    profile: HostProfile
    fingerprint: str
    roofline: Roofline | None
    roofline_is_new: bool
    telemetry: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "profile": self.profile.to_dict(),
                "roofline": self.roofline.to_dict() if self.roofline else None,
                "roofline_measured_now": self.roofline_is_new, "telemetry": self.telemetry}

    def render(self, console: Console) -> None:
        from strata.views.probe import render_profile, render_roofline

        render_profile(console, self.profile)
        if self.roofline is None:
            console.print("[dim]no roofline stored for this host: run `strata probe --measure`"
                          "[/dim]")
            return
        if not self.roofline_is_new:
            console.print("[dim]stored roofline for this host (re-measure with --measure):"
                          "[/dim]")
        render_roofline(console, self.roofline)


def run_probe(conn: sqlite3.Connection, measure: bool, smoke: bool, smoke_timeout_s: float,
              console: Console) -> ProbeResult:
    with console.status("probing…") as status:
        profile = probe_host(smoke=smoke, smoke_timeout_s=smoke_timeout_s,
                             progress=lambda m: status.update(f"probing: {m}"))
        fingerprint = save_host(conn, profile)
        if measure:
            roofline = measure_host(profile,
                                    progress=lambda m: status.update(f"measuring: {m}"))
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
