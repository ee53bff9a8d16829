"""`strata whatif`: fit, support, speed and cost of models on catalogue devices.

Reads the DB (its results on catalogue devices inform η), never writes it. Nothing is
measured: every figure is the catalogue's datasheet, fit's planner, or a prediction whose
basis is printed beside it.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from strata.errors import InputError
from strata.fit.plan import DEFAULT_CTX, FitOptions, check_model
from strata.hardware.catalogue import CatalogueDevice, load_catalogue
from strata.models.source import ResolvedModel, resolve
from strata.whatif.device import Hosting
from strata.whatif.plan import WhatIfRow, parse_on, whatif_row
from strata.whatif.provenance import Evidence, db_points
from strata.whatif.published import shipped_fit
from strata.whatif.sweep import Variant, sweep

SWEEPS = ("memory",)
PRESET_QUANTS = ("f32", "f16", "q8_0", "q4_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k")


def this_ram_bytes() -> int:
    """This host's RAM: a discrete GPU's neighbour unless --ram says otherwise."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def hosting(ram_gib: float | None) -> Hosting:
    if ram_gib is not None and not 1 <= ram_gib <= 16384:
        raise InputError(f"--ram {ram_gib:g}: give the host's RAM in GiB (1-16384)")
    return Hosting(int(ram_gib * 2**30) if ram_gib else this_ram_bytes())


def evidence(conn: sqlite3.Connection | None) -> Evidence:
    return Evidence(shipped_fit(), db_points(conn) if conn is not None else [])


@dataclass
class WhatIfAnswer:
    rows: list[WhatIfRow]
    ram_gib: float
    sweeps: dict[str, list[Variant]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def records(self) -> list[dict[str, Any]]:
        return [r.record() for r in self.rows]

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.records(), "ram_gib": self.ram_gib, "notes": self.notes,
                "sweeps": {dev: [{"variant": v.label, "memory_gib": v.device.memory_gib,
                                  "bandwidth_gbs": v.device.bandwidth_gbs,
                                  "largest_preset": v.largest,
                                  "rows": [r.record() for r in v.rows]} for v in variants]
                           for dev, variants in self.sweeps.items()}}


def _models(refs: list[str], options: FitOptions) -> list[ResolvedModel]:
    out = []
    for ref in refs:
        model = resolve(ref)
        if model.spec is None:
            raise InputError(f"MODEL {ref}: whatif works from a model's metadata; an "
                             "endpoint has none")
        check_model(model, options)
        out.append(model)
    return out


def _quant(models: list[ResolvedModel]) -> str:
    label = (models[0].spec.quant_label() or "").lower() if models[0].spec else ""
    return label if label in PRESET_QUANTS else "q4_k_m"


def options_for(ctx: int | None, kv_type: str | None, flash_attn: bool = True,
                batch: int = 1, backend: str = "llamacpp", swa_full: bool = False) -> FitOptions:
    """fit's options on a catalogue device: llama.cpp's own defaults of today, -fa auto (on
    wherever its backend has flash attention: CUDA, ROCm, Metal, Vulkan, CPU)."""
    return FitOptions(ctx=DEFAULT_CTX if ctx is None else ctx, batch=batch,
                      kv_type=kv_type.lower() if kv_type else None, backend=backend,
                      swa_full=swa_full, flash_attn=flash_attn)


def run_whatif(conn: sqlite3.Connection | None, refs: list[str], on: list[str], *,
               ctx: int | None, kv_type: str | None, prices: dict[str, float],
               ram_gib: float | None, sweep_what: str | None,
               flash_attn: bool = True) -> WhatIfAnswer:
    if sweep_what is not None and sweep_what not in SWEEPS:
        raise InputError(f"--sweep {sweep_what}: choose {', '.join(SWEEPS)}")
    devices: list[CatalogueDevice] = [parse_on(x) for x in on] or list(load_catalogue())
    if sweep_what and not on:
        raise InputError("--sweep memory varies one device family: name it with --on "
                         "(e.g. --on epyc-9654 --sweep memory)")
    options = options_for(ctx, kv_type, flash_attn)
    models = _models(refs, options)
    host, ev = hosting(ram_gib), evidence(conn)
    rows = [whatif_row(m, d, options, host, ev, prices) for m in models for d in devices]
    if not on:  # the whole catalogue: the fastest first, what does not fit last
        rows.sort(key=lambda r: -(r.tps("decode") or 0))
    notes = _notes(ev, host, devices, options) + _model_notes(models, options)
    unused = sorted(set(prices) - {d.id for d in devices})
    if unused:
        notes.append(f"--price for {', '.join(unused)}: not among the devices asked about")
    answer = WhatIfAnswer(rows, host.ram_bytes / 2**30, notes=notes)
    if sweep_what:
        for d in devices:
            answer.sweeps[d.id] = sweep(models, d, options, host, ev, _quant(models))
    return answer


def _model_notes(models: list[ResolvedModel], options: FitOptions) -> list[str]:
    out = []
    for m in models:
        limit = getattr(m.spec, "ctx_max", 0) if m.spec is not None else 0
        if limit and options.ctx > limit:
            out.append(f"--ctx {options.ctx:,} is beyond {m.ref}'s trained context "
                       f"({limit:,})")
    return out


def _notes(ev: Evidence, host: Hosting, devices: list[CatalogueDevice],
           options: FitOptions) -> list[str]:
    notes = []
    if any(d.kind == "gpu" for d in devices):
        notes.append(f"a discrete GPU is planned beside {host.ram_bytes / 2**30:.0f} GiB of "
                     "host RAM (--ram)")
    fa = "on (llama.cpp's -fa auto)" if options.flash_attn else "off (-fa 0)"
    notes += [f"flash attention {fa}: it sizes the compute buffers",
              "t/s = 1 / (x/η + c): x = seconds per token at the datasheet "
              "roofline, η and c from this DB's results on the device or its architecture, "
              "else published measurements of its class, else a prior (the basis column)",
              "datasheet figures, not measurements: every figure's source is in "
              "`strata whatif --list -o json`"]
    if ev.points:
        notes.append(f"{len(ev.points)} stored results on catalogue devices inform η")
    return notes
