"""`whatif --sweep memory`: one device family with its memory size and bandwidth varied.

The question DRAM and GPU prices force: is more memory or faster memory worth it? For a CPU
platform the bandwidth steps are memory channels (2, 4, 8, 12 at the device's MT/s); for a
GPU or a unified chip they are the device's bandwidth scaled (x0.5 … x2, a cheaper or a
faster part of the family). Each variant gets fit's verdict and the predicted decode t/s of
each model, and the largest published preset (at the models' quantisation) it runs whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.fit.plan import FitOptions
from strata.fit.verdict import FITS
from strata.hardware.catalogue import CatalogueDevice
from strata.models.source import ResolvedModel, resolve
from strata.whatif.device import Hosting
from strata.whatif.plan import WhatIfRow, device_fit, whatif_row
from strata.whatif.provenance import Evidence

CHANNELS = (2, 4, 8, 12)
BW_SCALES = (0.5, 1.0, 1.5, 2.0)
GPU_MEMORY_GIB = (8, 12, 16, 24, 32, 48, 96)


@dataclass
class Variant:
    label: str
    device: CatalogueDevice
    rows: list[WhatIfRow] = field(default_factory=list)
    largest: str | None = None  # the largest published preset that fits whole


def variants(dev: CatalogueDevice) -> list[Variant]:
    """Memory sizes at the device's bandwidth (a GPU: the sizes GPUs are sold with, and its
    own; otherwise the configurations sold), then bandwidths at its memory size."""
    out = []
    sizes = sorted({*GPU_MEMORY_GIB, dev.memory_gib}) if dev.kind == "gpu" else \
        sorted({*dev.memory_options_gib, dev.memory_gib})
    for gib in sizes:
        mark = " (this device)" if gib == dev.memory_gib else ""
        out.append(Variant(f"{gib:g} GiB @ {dev.bandwidth_gbs:g} GB/s{mark}",
                           dev.with_memory(gib)))
    if dev.kind == "cpu" and dev.memory_mts:
        ddr = (dev.memory_type or "DDR").split("-")[0]
        for ch in CHANNELS:
            if ch == dev.memory_channels:
                continue  # the device itself: the size rows hold it
            bw = ch * 8 * dev.memory_mts / 1000
            out.append(Variant(f"{ch} ch x {ddr}-{dev.memory_mts} = {bw:g} GB/s @ "
                               f"{dev.memory_gib:g} GiB",
                               dev.with_memory(dev.memory_gib, bw, ch)))
    else:
        for scale in BW_SCALES:
            if scale == 1.0:
                continue
            bw = dev.bandwidth_gbs * scale
            out.append(Variant(f"{bw:g} GB/s (x{scale:g}) @ {dev.memory_gib:g} GiB",
                               dev.with_memory(dev.memory_gib, bw)))
    return out


def presets_by_size(quant: str) -> list[tuple[int, str, ResolvedModel]]:
    """The published presets at `quant`, largest weights first (resolved once per sweep)."""
    from strata.models.presets import preset_names

    models = [(f"{n}@{quant}", resolve(f"synthetic:{n}@{quant}"))
              for n in preset_names(include_test=False)]
    return sorted(((m.spec.weight_bytes(), name, m) for name, m in models
                   if m.spec is not None), key=lambda t: -t[0])


def largest_preset(dev: CatalogueDevice, presets: list[tuple[int, str, ResolvedModel]],
                   options: FitOptions, hosting: Hosting) -> str | None:
    """The preset with the most weight bytes that fits whole on `dev`."""
    for _, name, model in presets:
        if device_fit(model, dev, options, hosting)[1].verdict == FITS:
            return name
    return None


def sweep(models: list[ResolvedModel], dev: CatalogueDevice, options: FitOptions,
          hosting: Hosting, evidence: Evidence, quant: str) -> list[Variant]:
    out, presets = variants(dev), presets_by_size(quant)
    for v in out:
        v.rows = [whatif_row(m, v.device, options, hosting, evidence, {}) for m in models]
        v.largest = largest_preset(v.device, presets, options, hosting)
    return out
