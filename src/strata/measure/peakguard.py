"""A result above the stored peak re-measures the peak (issue 10 §2).

The roofline's figures are maxima of what the vendor path reaches. When a later result —
a bench test's achieved bandwidth or FLOP/s, a kernel-lab kernel — beats a stored figure by
more than `PEAK_MARGIN`, the stored figure was probably measured low (a busy host, a cold
clock). `PeakKeeper.check` then measures that figure again, keeps the higher of old and new
(peaks are maxima), stores the roofline and says what happened, so the caller can recompute
η against the corrected peak. Each (device, group) is re-measured at most once per keeper:
a result that still exceeds the fresh peak is a finding about the result (its byte/FLOP
model, or a kernel really faster than the vendor path), not about the peak.

    keeper = PeakKeeper(roofline, remeasure=host_remeasure(profile), save=store_roofline)
    check = keeper.check("cpu", "fp32", achieved=181.0)   # GFLOP/s
    if check.raised:
        ...recompute η against keeper.roofline...

`check_peak` is the pure comparison, for callers that only want to know.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from strata.measure.peak import merge_best
from strata.measure.roofline import DeviceRoofline, Figure, Roofline

PEAK_MARGIN = 0.05  # a result more than 5% above a stored peak re-measures it
BANDWIDTH = "bandwidth"  # the group of a device's on-device stream figures

Remeasure = Callable[[str, str], dict[str, Figure]]  # (device, group) -> fresh figures


@dataclass
class PeakCheck:
    """One achieved figure against the stored peak of its group."""

    device: str
    group: str  # "bandwidth" or a compute dtype ("fp32", ...)
    achieved: float  # GB/s or GFLOP/s (GOP/s for int8)
    stored: float | None  # the peak before this check; None: the roofline lacks it
    exceeded: bool  # achieved > stored x (1 + margin)
    remeasured: bool = False
    peak: float | None = None  # the peak after this check (== stored unless raised)
    note: str = ""

    @property
    def raised(self) -> bool:
        return bool(self.remeasured and self.peak and self.stored and self.peak > self.stored)

    @property
    def still_exceeded(self) -> bool:
        return bool(self.exceeded and self.peak and self.achieved > self.peak * (1 + PEAK_MARGIN))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "raised": self.raised, "still_exceeded": self.still_exceeded}


def stored_peak(roof: DeviceRoofline, group: str) -> float | None:
    return roof.peak_bandwidth_gbs() if group == BANDWIDTH else roof.peak_gflops(group)


def unit(group: str) -> str:
    return "GB/s" if group == BANDWIDTH else ("GOP/s" if group == "int8" else "GFLOP/s")


def check_peak(roof: DeviceRoofline, group: str, achieved: float,
               margin: float = PEAK_MARGIN) -> PeakCheck:
    """Pure: does `achieved` exceed the stored peak of `group` by more than `margin`?"""
    stored = stored_peak(roof, group)
    exceeded = bool(stored and achieved > stored * (1 + margin))
    return PeakCheck(roof.device, group, achieved, stored, exceeded, peak=stored)


class PeakKeeper:
    """Holds a roofline; re-measures a group when a result beats its peak by > margin.

    remeasure(device, group) returns fresh figures of the group (microbench.measure_group);
    save(roofline), when given, stores the corrected roofline (e.g. as a new 'roofline'
    measurement of the host). `roofline` is updated in place, so every holder of it sees
    the corrected peak.
    """

    def __init__(self, roofline: Roofline, remeasure: Remeasure,
                 save: Callable[[Roofline], None] | None = None,
                 margin: float = PEAK_MARGIN) -> None:
        self.roofline, self.remeasure, self.save, self.margin = roofline, remeasure, save, margin
        self.checks: list[PeakCheck] = []  # the ones that exceeded, in order
        self._tried: set[tuple[str, str]] = set()

    def check(self, device: str, group: str, achieved: float, why: str = "") -> PeakCheck:
        """Compare; on > margin, re-measure once per (device, group), keep the higher peak.
        `why` names the result (e.g. "bench #12 pp512") in the roofline's history."""
        roof = self.roofline.device(device)
        if roof is None:
            return PeakCheck(device, group, achieved, None, False,
                             note=f"no stored roofline for {device}")
        check = check_peak(roof, group, achieved, self.margin)
        if not check.exceeded:
            return check
        self.checks.append(check)
        if (device, group) in self._tried:
            check.note = f"{group} peak of {device} already re-measured in this run"
            return check
        self._tried.add((device, group))
        try:
            fresh = self.remeasure(device, group)
        except Exception as exc:  # a re-measure that cannot run keeps the stored peak
            check.note = f"re-measure failed ({type(exc).__name__}: {exc}); stored peak kept"
            return check
        self._merge(roof, group, fresh, check, why)
        return check

    def _merge(self, roof: DeviceRoofline, group: str, fresh: dict[str, Figure],
               check: PeakCheck, why: str) -> None:
        figures = roof.bandwidth if group == BANDWIDTH else roof.compute
        reason = (f"re-measured after a result reached {check.achieved:,.1f} {unit(group)} "
                  f"(> {check.stored:,.1f} + {self.margin:.0%})" + (f": {why}" if why else ""))
        for name, fig in fresh.items():
            figures[name] = merge_best(figures.get(name), fig, reason)
        check.remeasured = True
        check.peak = stored_peak(roof, group)
        check.note = (f"{roof.device} {group} peak re-measured: "
                      f"{check.stored:,.1f} -> {check.peak:,.1f} {unit(group)}"
                      + ("" if check.raised else " (the stored peak holds)"))
        self.roofline.remeasured.append(f"{check.note}; {reason}")
        if self.save is not None and check.raised:  # an unchanged peak needs no new row
            self.save(self.roofline)
