"""The what-if answer: per model and catalogue device, fit + support + speed + cost.

Fit is `strata fit`'s own planner run on the device as a host profile (strata.whatif.
device), so a catalogue RTX 4090 gets the verdict a probed one would. Speed is predicted
only where the model fits whole (a split's speed is not modelled); cost per t/s only where
a price (--price) or a power figure (the catalogue's TDP) is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from strata.errors import InputError
from strata.fit.plan import FitOptions, FitReport, fit_model
from strata.fit.predict import Prediction
from strata.fit.verdict import FITS, NO, PARTIAL, DeviceFit
from strata.hardware.catalogue import CatalogueDevice, find_device
from strata.hardware.profile import HostProfile
from strata.models.source import ResolvedModel
from strata.whatif.device import Hosting, fit_device_key, gpu_usable_bytes, host_profile
from strata.whatif.predict import predict_device
from strata.whatif.provenance import Evidence
from strata.whatif.support import Support, support


def parse_on(text: str, flag: str = "--on") -> CatalogueDevice:
    """`--on ID` or `--on ID:GiB` (another memory size of the same device)."""
    name, _, mem = text.partition(":")
    dev = find_device(name.strip(), flag=flag)
    if not mem:
        return dev
    try:
        gib = float(mem.lower().removesuffix("gb").removesuffix("gib"))
    except ValueError:
        raise InputError(f"{flag} {text}: memory after ':' must be a number of GiB "
                         f"(e.g. {dev.id}:64)") from None
    if not 1 <= gib <= 4096:
        raise InputError(f"{flag} {text}: {gib:g} GiB is not a memory size (1-4096)")
    return dev.with_memory(gib)


def read_price_file(path: str) -> dict[str, float]:
    """`--prices FILE`: JSON {"device": usd, …} or lines `device=usd` / `device,usd` (# for
    comments) -> {catalogue id: dollars}; every error names the file."""
    import json
    from pathlib import Path

    flag = f"--prices {path}:"
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{flag} cannot read it ({e.strerror})") from None
    if text.lstrip()[:1] in ("{", "["):
        try:
            raw = json.loads(text)
            items = [f"{k}={v}" for k, v in raw.items()]
        except (json.JSONDecodeError, AttributeError):
            raise InputError(f"{flag} not a JSON object of device: USD") from None
    else:
        lines = (ln.split("#", 1)[0].strip() for ln in text.splitlines())
        items = [ln.replace(",", "=", 1) if "=" not in ln else ln for ln in lines if ln]
    return parse_prices(items, flag)


def parse_prices(items: list[str], flag: str = "--price") -> dict[str, float]:
    """`--price ID=USD` (repeatable) -> {catalogue id: dollars}."""
    import math

    out = {}
    for item in items:
        name, sep, usd = item.partition("=")
        try:
            value = float(usd.strip().lstrip("$").replace(",", "")) if sep else -1.0
        except ValueError:
            value = -1.0
        if not math.isfinite(value) or value <= 0:
            raise InputError(f"{flag} {item}: give DEVICE=USD with a price above 0, e.g. "
                             "rtx-4090=1599")
        out[find_device(name.strip(), flag=f"{flag} {item}:").id] = value
    return out


@dataclass
class WhatIfRow:
    model: str
    device: CatalogueDevice
    fit: DeviceFit
    memory_basis: str
    support: Support
    predictions: list[Prediction] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    price_usd: float | None = None

    def prediction(self, phase: str) -> Prediction | None:
        """The phase's bench-default test (pp512 or tg128), not the deep-context one."""
        return next((p for p in self.predictions if p.phase == phase and "@" not in p.test),
                    None)

    def tps(self, phase: str) -> float | None:
        p = self.prediction(phase)
        return p.tps if p else None

    @property
    def tps_per_kusd(self) -> float | None:
        tg = self.tps("decode")
        return tg / self.price_usd * 1000 if tg and self.price_usd else None

    @property
    def tps_per_watt(self) -> float | None:
        tg = self.tps("decode")
        return tg / self.device.tdp_w if tg and self.device.tdp_w else None

    def record(self) -> dict[str, Any]:
        """One flat record (docs/output.md: whatif)."""
        dec, pre = self.prediction("decode"), self.prediction("prefill")
        d = self.device
        return {"model_filename": self.model, "device": d.id, "name": d.name,
                "class": d.device_class, "arch": d.arch, "memory_gib": d.memory_gib,
                "bandwidth_gbs": d.bandwidth_gbs, "available_bytes": self.fit.budget.available,
                "available_basis": self.memory_basis, "verdict": self.fit.verdict,
                "verdict_text": self.fit.verdict_text, "max_ctx": self.fit.max_ctx,
                "quants_that_fit": self.fit.quants,
                "total_bytes": (self.fit.to_dict()["placement"]["device"] or {}).get("total"),
                "support": self.support.text, "support_detail": self.support.to_dict(),
                **_phase_json("decode", dec), **_phase_json("prefill", pre),
                "prediction_absent": self.absent, "price_usd": self.price_usd,
                "tdp_w": d.tdp_w, "decode_ts_per_kusd": self.tps_per_kusd,
                "decode_ts_per_watt": self.tps_per_watt}


def _phase_json(phase: str, p: Prediction | None) -> dict[str, Any]:
    if p is None:
        return {f"predicted_{phase}_ts": None, f"predicted_{phase}_low_ts": None,
                f"predicted_{phase}_high_ts": None, f"{phase}_test": None,
                f"{phase}_eta": None, f"{phase}_eta_basis": None}
    return {f"predicted_{phase}_ts": p.tps, f"predicted_{phase}_low_ts": p.low_tps,
            f"predicted_{phase}_high_ts": p.high_tps, f"{phase}_test": p.test,
            f"{phase}_eta": p.eta.value, f"{phase}_eta_basis": p.eta.basis}


def device_fit(model: ResolvedModel, dev: CatalogueDevice, options: FitOptions,
               hosting: Hosting) -> tuple[FitReport, DeviceFit]:
    """fit's plan of `model` on `dev` (as a host), and the device's own row, renamed."""
    report, row, _ = _plan(model, dev, options, hosting)
    return report, row


def _plan(model: ResolvedModel, dev: CatalogueDevice, options: FitOptions,
          hosting: Hosting) -> tuple[FitReport, DeviceFit, HostProfile]:
    profile = host_profile(dev, hosting)
    report = fit_model(model, profile, options)
    row = report.row(fit_device_key(dev))
    _, basis = gpu_usable_bytes(dev)
    row.budget = replace(row.budget, device=dev.id, name=dev.name,
                         basis=basis if dev.kind != "cpu" else
                         f"{dev.memory_gib:g} GiB of DRAM (nothing else running)")
    if dev.kind == "unified":
        _one_memory(row, dev)
    return report, row, profile


def _one_memory(row: DeviceFit, dev: CatalogueDevice) -> None:
    """A unified chip's GPU part and CPU part come out of one memory: a plan whose two parts
    add up to more than it has does not fit (fit checks each against its own budget)."""
    if row.verdict not in (FITS, PARTIAL):
        return
    parts = row.to_dict()["placement"]
    total = sum((parts[side] or {}).get("total") or 0 for side in ("device", "host"))
    if total <= dev.memory_bytes:
        return
    gib = 2**30
    row.verdict = NO
    row.reason = (f"the GPU's part and the CPU's part need {total / gib:.2f} GiB together, "
                  f"{dev.memory_gib:g} GiB of unified memory holds both")
    row.max_ctx = None


def _speed(model: ResolvedModel, dev: CatalogueDevice, row: DeviceFit, profile: HostProfile,
           options: FitOptions, evidence: Evidence) -> tuple[list[Prediction], list[str]]:
    """Predicted t/s where the model fits whole; else why not (and a MoE's offload plan)."""
    if row.verdict == FITS:
        rt = options.rules.runtime(model, profile, row.budget.kind, options.kv_type)
        return predict_device(rt.spec, dev, rt.kv_type, rt.runtime_dtype, options.ctx,
                              evidence), []
    absent = [f"{dev.id}: {row.verdict_text}: no speed predicted (a split's speed is not "
              "modelled)"]
    eo = row.expert_offload
    if eo is not None and eo.fits:  # a MoE: the shared weights on the GPU still help
        absent.append(f"{dev.id}: with the experts in RAM ({eo.flags}) the rest fits on the "
                      "GPU: strata fit MODEL --on DEVICE shows the plan")
    return [], absent


def whatif_row(model: ResolvedModel, dev: CatalogueDevice, options: FitOptions,
               hosting: Hosting, evidence: Evidence, prices: dict[str, float]) -> WhatIfRow:
    _, row, profile = _plan(model, dev, options, hosting)
    predictions, absent = _speed(model, dev, row, profile, options, evidence)
    return WhatIfRow(model.ref, dev, row, row.budget.basis, support(dev), predictions, absent,
                     prices.get(dev.id))


def fit_on(model: ResolvedModel, devices: list[CatalogueDevice], options: FitOptions,
           hosting: Hosting, evidence: Evidence) -> FitReport:
    """`strata fit MODEL --on DEVICE…`: fit's report with one row per catalogue device."""
    rows, predictions, absent, first = [], [], [], None
    for dev in devices:
        report, row, profile = _plan(model, dev, options, hosting)
        first = first or report
        rows.append(row)
        speed, why = _speed(model, dev, row, profile, options, evidence)
        predictions += speed
        absent += why
    assert first is not None
    ram = hosting.ram_bytes / 2**30
    return FitReport(model=first.model, options=options,
                     host=f"catalogue devices (datasheet figures; a discrete GPU beside "
                          f"{ram:.0f} GiB of RAM)", rows=rows, quants=first.quants,
                     predictions=predictions, prediction_absent=absent, rules=first.rules,
                     notes=[*first.notes, "predicted t/s: t = x/η + c per token, x = time at "
                            "the datasheet roofline; η and c from this DB, else published "
                            "measurements, else a prior (strata whatif --help)"])
