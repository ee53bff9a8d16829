"""The device catalogue: GPUs, unified-memory chips and CPU platforms this host is not.

Shipped as data (`hardware/data/catalogue/*.json`, one file per vendor group): memory size,
memory bandwidth, dense peak FLOP/s per dtype, architecture, power, last-level cache, and a
source for every figure. `strata whatif` and `strata fit --on` plan and predict on these;
nothing here is measured. Prices are never shipped (they change weekly): `--price`.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from strata.errors import InputError

CATALOGUE_DIR = Path(__file__).parent / "data" / "catalogue"
MEASUREMENTS_FILE = "measurements.json"
KINDS = ("gpu", "unified", "cpu")
# figures a device may carry, each needing a source (tflops: one source for all its dtypes)
FIGURES = ("memory_gib", "memory_options_gib", "bus_width_bits", "bandwidth_gbs", "tflops",
           "tdp_w", "cache_mib", "memory_channels", "memory_mts", "cores")
# words that name a vendor or a product line, dropped when matching what a user typed
NOISE = ("nvidia", "geforce", "amd", "radeon", "apple", "intel", "graphics", "gpu")


@dataclass(frozen=True)
class CatalogueDevice:
    id: str
    name: str
    vendor: str
    kind: str  # gpu | unified | cpu
    arch: str
    family: str
    memory_gib: float
    bandwidth_gbs: float
    tflops: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    memory_options_gib: tuple[float, ...] = ()
    memory_type: str | None = None
    released: str | None = None
    tdp_w: float | None = None
    cache_mib: float | None = None
    memory_channels: int | None = None
    memory_mts: int | None = None
    cores: int | None = None
    file: str = ""

    @property
    def device_class(self) -> str:
        """The class published η is fitted per: the memory system and the software that
        drives it differ by vendor, kind and memory technology, less by model."""
        if self.kind == "cpu":
            return "cpu"
        if self.vendor == "apple":
            return "apple"
        # HBM parts reach a smaller share of their far larger datasheet bandwidth with the
        # same kernels (the published A100/H100 figures say so): their own class
        hbm = (self.memory_type or "").upper().startswith("HBM")
        return f"{self.vendor}-{'hbm' if hbm else 'gpu'}"

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def cache_bytes(self) -> int | None:
        return int(self.cache_mib * 2**20) if self.cache_mib else None

    def source(self, figure: str) -> str:
        return self.sources.get(figure, "no source")

    def with_memory(self, gib: float, bandwidth_gbs: float | None = None,
                    channels: int | None = None) -> CatalogueDevice:
        """The same device with another memory size (and bandwidth): --sweep memory."""
        from dataclasses import replace

        return replace(self, memory_gib=gib,
                       bandwidth_gbs=bandwidth_gbs if bandwidth_gbs else self.bandwidth_gbs,
                       memory_channels=channels or self.memory_channels)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "vendor": self.vendor, "kind": self.kind,
                "arch": self.arch, "family": self.family, "class": self.device_class,
                "memory_gib": self.memory_gib,
                "memory_options_gib": list(self.memory_options_gib),
                "memory_type": self.memory_type, "bandwidth_gbs": self.bandwidth_gbs,
                "tflops": dict(self.tflops), "tdp_w": self.tdp_w, "cache_mib": self.cache_mib,
                "memory_channels": self.memory_channels, "memory_mts": self.memory_mts,
                "cores": self.cores, "released": self.released, "sources": dict(self.sources)}


def _device(raw: dict[str, Any], file: str) -> CatalogueDevice:
    opts = tuple(float(x) for x in raw.get("memory_options_gib") or ())
    return CatalogueDevice(
        id=raw["id"], name=raw["name"], vendor=raw["vendor"], kind=raw["kind"],
        arch=raw.get("arch", ""), family=raw.get("family", ""),
        memory_gib=float(raw["memory_gib"]), bandwidth_gbs=float(raw["bandwidth_gbs"]),
        tflops={k: float(v) for k, v in (raw.get("tflops") or {}).items()},
        sources=dict(raw.get("sources") or {}),
        aliases=tuple(a.lower() for a in raw.get("aliases") or ()), memory_options_gib=opts,
        memory_type=raw.get("memory_type"), released=raw.get("released"),
        tdp_w=raw.get("tdp_w"), cache_mib=raw.get("cache_mib"),
        memory_channels=raw.get("memory_channels"), memory_mts=raw.get("memory_mts"),
        cores=raw.get("cores"), file=file)


def device_files(folder: Path = CATALOGUE_DIR) -> list[Path]:
    return sorted(p for p in folder.glob("*.json") if p.name != MEASUREMENTS_FILE)


@lru_cache(maxsize=4)
def load_catalogue(folder: Path = CATALOGUE_DIR) -> tuple[CatalogueDevice, ...]:
    devices = []
    for path in device_files(folder):
        raw = json.loads(path.read_text(encoding="utf-8"))
        devices += [_device(d, path.name) for d in raw.get("devices", [])]
    return tuple(devices)


def _norm(text: str) -> str:
    """'NVIDIA GeForce RTX 4090' -> 'rtx4090'; 'M3 Max 40-core' -> 'm3max40c'."""
    words = re.split(r"[\s_\-/()]+", text.lower())
    joined = "".join(w for w in words if w and w not in NOISE)
    return joined.replace("core", "c")


def _keys(d: CatalogueDevice) -> set[str]:
    return {_norm(k) for k in (d.id, d.name, *d.aliases)}


def _extends(key: str, typed: str) -> bool:
    """`typed` is `key` cut before a letter ("a100" of "a100sxm80gb"), not inside a number
    ("rtx409" is not "rtx4090": a digit short is a typo, never a guess)."""
    return key.startswith(typed) and len(key) > len(typed) and not key[len(typed)].isdigit()


def find_device(name: str, devices: tuple[CatalogueDevice, ...] | None = None,
                flag: str = "--on") -> CatalogueDevice:
    """The catalogue device a user named (id, name or alias; case, spaces and vendor words
    ignored; a unique prefix of one, such as "a40"). InputError listing the candidates when
    several match, or close matches when none does; `flag` names the option in it."""
    devices = devices if devices is not None else load_catalogue()
    want = _norm(name)
    found = [d for d in devices if want in _keys(d)] or \
        [d for d in devices if want and any(_extends(k, want) for k in _keys(d))]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise InputError(f"{flag} {name}: names several devices "
                         f"({', '.join(d.id for d in found)}); give one of those ids")
    keys = {k: d.id for d in devices for k in _keys(d)}
    close = difflib.get_close_matches(want, list(keys), n=8, cutoff=0.6)
    near = list(dict.fromkeys(keys[k] for k in close))[:5]
    hint = f"close: {', '.join(near)}" if near else "none close"
    raise InputError(f"{flag} {name}: not in the device catalogue ({hint}); "
                     "`strata whatif --list` shows every device")


def problems(raw: dict[str, Any]) -> list[str]:
    """What is wrong with one catalogue device entry (the schema test runs this on all):
    a figure without a source, a unit that cannot be right, a CPU bandwidth that is not
    channels x 64 bit x MT/s."""
    out = []
    did = raw.get("id", "?")
    for key in ("id", "name", "vendor", "kind", "arch", "memory_gib", "bandwidth_gbs"):
        if raw.get(key) in (None, ""):
            out.append(f"{did}: no {key}")
    if raw.get("kind") not in KINDS:
        out.append(f"{did}: kind {raw.get('kind')!r} is not one of {KINDS}")
    sources = raw.get("sources") or {}
    for fig in FIGURES:
        if raw.get(fig) not in (None, [], {}) and not str(sources.get(fig, "")).strip():
            out.append(f"{did}: {fig} has no source")
    out += _unit_problems(did, raw)
    return out


# plausible ranges per unit: a figure outside is a unit slip (TB/s for GB/s, GB for GiB)
RANGES = {"memory_gib": (1, 4096), "bandwidth_gbs": (20, 20000), "tdp_w": (5, 3000),
          "cache_mib": (1, 2048)}


def _unit_problems(did: str, raw: dict[str, Any]) -> list[str]:
    out = []
    for key, (lo, hi) in RANGES.items():
        v = raw.get(key)
        if v is not None and not lo <= float(v) <= hi:
            out.append(f"{did}: {key} {v} is outside {lo}-{hi}")
    for dtype, v in (raw.get("tflops") or {}).items():
        if not 0.05 <= float(v) <= 20000:
            out.append(f"{did}: tflops.{dtype} {v} is outside 0.05-20000 (TFLOP/s)")
    ch, mts = raw.get("memory_channels"), raw.get("memory_mts")
    if raw.get("kind") == "cpu":
        if not ch or not mts:
            out.append(f"{did}: a CPU platform needs memory_channels and memory_mts")
        elif abs(ch * 8 * mts / 1000 - float(raw.get("bandwidth_gbs") or 0)) > 0.5:
            out.append(f"{did}: bandwidth_gbs {raw.get('bandwidth_gbs')} != {ch} channels x 8 "
                       f"B x {mts} MT/s = {ch * 8 * mts / 1000:g} GB/s")
    return out
