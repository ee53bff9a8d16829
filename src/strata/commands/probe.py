"""`strata probe`: probe, optionally measure, store, and hand back what to print.

`--measure` on a busy host (other processes using the CPUs, HostLoadMonitor) measures again,
up to MEASURE_ATTEMPTS times, keeping each figure's best; when every attempt was busy the
roofline is known to be low and is not stored unless `allow_busy` (--allow-busy) says so.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape

from strata.hardware.microbench import measure_host
from strata.hardware.probe import probe_host
from strata.hardware.profile import HostProfile, SupportVerdict
from strata.hardware.support import keep_smoke_verdicts
from strata.host import BUSY_PAUSE_S, MEASURE_ATTEMPTS, busy_refusal, measure_until_quiet
from strata.measure.peak import keep_stored_peaks, trust_lines
from strata.measure.roofline import Roofline
from strata.store.hosts import latest_measurement, load_host, save_host, save_measurement
from strata.views.console import progress_enabled

__all__ = ["BUSY_PAUSE_S", "MEASURE_ATTEMPTS", "ProbeResult", "busy_refusal", "measure_until_quiet",
           "probe_records", "run_probe"]


@dataclass
class ProbeResult:
    profile: HostProfile
    fingerprint: str
    roofline: Roofline | None
    roofline_is_new: bool
    telemetry: dict[str, Any] | None = None
    refused: str | None = None  # why a measured roofline was not stored (a busy host)
    kept: list[str] = field(default_factory=list)  # peaks an earlier run measured higher

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "profile": self.profile.to_dict(),
                "roofline": self.roofline.to_dict() if self.roofline else None,
                "roofline_measured_now": self.roofline_is_new,
                "roofline_stored": self.roofline_is_new and self.refused is None,
                "roofline_refused": self.refused, "peaks_kept": self.kept,
                "telemetry": self.telemetry}

    def render(self, console: Console) -> None:
        from strata.views.probe import render_profile, render_roofline

        render_profile(console, self.profile)
        if self.roofline is None:
            console.print("[dim]no roofline stored for this host: run `strata probe --measure`"
                          "[/dim]")
            return
        if self.refused:
            console.print("[yellow]measured on a busy host and NOT stored:[/yellow]")
        elif self.roofline_is_new and self.roofline.measured_busy:  # --allow-busy
            console.print("[yellow]measured on a busy host and stored, flagged as such "
                          "(--allow-busy): its peaks may be low[/yellow]")
        elif not self.roofline_is_new:
            console.print("[dim]stored roofline for this host (re-measure with --measure):"
                          "[/dim]")
        render_roofline(console, self.roofline)
        for line in [*self.kept, *trust_lines(self.roofline)]:
            console.print(line, highlight=False, markup=False)


def run_probe(conn: sqlite3.Connection, measure: bool, smoke: bool, smoke_timeout_s: float,
              console: Console, allow_busy: bool = False,
              measurer: Callable[[HostProfile, Callable[[str], None]], Roofline] | None = None,
              pause_s: float = BUSY_PAUSE_S, fresh: bool = False) -> ProbeResult:
    """measurer(profile, progress) -> Roofline: one attempt (default measure_host); tests
    pass recorded measurements, since a busy host cannot be arranged to order. A new
    measurement keeps the stored roofline's higher stable peaks unless `fresh`."""
    attempt = measurer or (lambda profile, say: measure_host(profile, progress=say))
    with _steps(console) as say:
        profile = probe_host(smoke=smoke, smoke_timeout_s=smoke_timeout_s,
                             progress=lambda m: say(f"probing: {m}"))
        if not smoke:
            keep_smoke_verdicts(profile, load_host(conn, profile.fingerprint()))
        fingerprint = save_host(conn, profile)
        if measure:
            roofline = measure_until_quiet(
                lambda step: attempt(profile, step),
                lambda m: say(f"measuring: {m}"), pause_s=pause_s)
            if roofline.measured_busy and not allow_busy:
                return ProbeResult(profile, fingerprint, roofline, True,
                                   refused=busy_refusal(roofline))
            stored = latest_measurement(conn, fingerprint, "roofline")
            kept = ([] if fresh or not stored else
                    keep_stored_peaks(roofline, Roofline.from_dict(stored)))
            save_measurement(conn, fingerprint, "roofline", roofline.to_dict())
            return ProbeResult(profile, fingerprint, roofline, True, kept=kept)
    stored = latest_measurement(conn, fingerprint, "roofline")
    return ProbeResult(profile, fingerprint, Roofline.from_dict(stored) if stored else None,
                       False)


@contextmanager
def _steps(console: Console) -> Iterator[Callable[[str], None]]:
    """Progress of the probe: a spinner on a terminal, one plain line per step otherwise,
    nothing with --no-progress."""
    if not progress_enabled():
        yield lambda _m: None
    elif console.is_terminal:
        with console.status("probing…") as status:
            yield lambda m: status.update(escape(m))
    else:
        yield lambda m: console.print(m, highlight=False, markup=False)


def probe_records(result: ProbeResult) -> list[dict[str, Any]]:
    """One flat record per device: what it is, its support verdict, its roofline figures."""
    roof = {d.device: d for d in result.roofline.devices} if result.roofline else {}
    return [_device_record(result, v, roof.get(v.device)) for v in result.profile.verdicts]


def _device_record(result: ProbeResult, v: SupportVerdict, roof: Any) -> dict[str, Any]:
    p = result.profile
    gpu = next((g for g in p.gpus if g.key == v.device), None)
    return {
        "fingerprint": result.fingerprint, "hostname": p.hostname, "device": v.device,
        "name": gpu.name if gpu else p.cpu.model,
        "arch": gpu.arch if gpu else p.cpu.arch,
        "memory_bytes": gpu.memory_total_bytes if gpu else p.cpu.ram_total_bytes,
        "support": v.status, "smoke_ok": v.smoke.ok if v.smoke else None,
        "works": v.works, "fails": v.fails, "remedy": v.remedy,
        "bandwidth_gbs": roof.peak_bandwidth_gbs() if roof else None,
        "fp32_gflops": roof.peak_gflops("fp32") if roof else None,
        "fp16_gflops": roof.peak_gflops("fp16") if roof else None,
    }


def run_watch(conn: sqlite3.Connection, fingerprint: str, seconds: float, interval_s: float,
              console: Console) -> dict[str, Any]:
    """Live telemetry for `seconds`; the summary is stored with the host and returned."""
    from strata.hardware.watch import watch

    data = watch(seconds, interval_s, console).to_dict()
    save_measurement(conn, fingerprint, "telemetry", data)
    return data
