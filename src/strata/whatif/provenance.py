"""Where a catalogue device's η (and per-token cost c) comes from, in order of trust:

1. this DB: bench results measured on the same device (any host strata has stored, fleet
   members included), refitted against the device's datasheet bandwidth;
2. this DB, same architecture (sm_89, gfx1100, apple-m3 …) on another device;
3. published: the class fit of the shipped measurements (strata.whatif.published);
4. a prior (fit's: η 0.7, 0.5-0.9), said as such.

Every prediction row names its tier and basis. DB results that cannot inform another
model's speed are left out as fit leaves them out: cache-resident, or on a busy host.
"""

from __future__ import annotations

import sqlite3
import statistics
from dataclasses import dataclass, field

from strata.errors import InputError
from strata.fit.predict import PRIOR_ETA, PRIOR_HIGH, PRIOR_LOW, EtaSource
from strata.hardware.catalogue import CatalogueDevice, find_device
from strata.hardware.profile import HostProfile
from strata.store.runs import StoredResult
from strata.whatif.published import Published, fit_decode

TIERS = ("this device in the DB", "same architecture in the DB", "published",
         "published, other vendor", "published, other classes", "prior")


@dataclass(frozen=True)
class Speed:
    """How a device class turns ideal seconds per token into measured ones."""

    phase: str
    eta: float
    c_s: float
    low: float  # t/s multipliers: the range is predicted x low .. predicted x high
    high: float
    tier: str
    basis: str
    sources: tuple[EtaSource, ...] = ()

    def tps(self, ideal_s: float) -> float:
        return 1.0 / (ideal_s / self.eta + self.c_s)


def prior(phase: str) -> Speed:
    return Speed(phase, PRIOR_ETA, 0.0, PRIOR_LOW / PRIOR_ETA, PRIOR_HIGH / PRIOR_ETA, "prior",
                 f"prior η {PRIOR_ETA} (range {PRIOR_LOW}-{PRIOR_HIGH}): no measured or "
                 f"published {phase} figures for this class of device")


@dataclass(frozen=True)
class DbPoint:
    """One stored bench result on a catalogue device."""

    device: CatalogueDevice
    source: EtaSource
    phase: str
    bytes_per_token: float
    flops_per_token: float
    compute_dtype: str | None
    per_pass: int
    measured_s: float

    def ideal_s(self, dev: CatalogueDevice) -> float | None:
        """Seconds per token at `dev`'s datasheet roofline."""
        memory = self.bytes_per_token / self.per_pass / (dev.bandwidth_gbs * 1e9)
        if self.phase == "decode":
            return memory
        peak = dev.tflops.get(self.compute_dtype or "") or dev.tflops.get("fp32")
        compute = self.flops_per_token / (peak * 1e12) if peak else None
        return max(memory, compute) if compute else None


def _device_of(profile: HostProfile, device_key: str) -> CatalogueDevice | None:
    """The catalogue device a stored host's roofline device is, if any."""
    if device_key == "cpu":
        name = profile.cpu.model or ""
    else:
        name = next((g.name for g in profile.gpus if g.key == device_key), "")
    if not name:
        return None
    try:
        return find_device(name)
    except InputError:  # a device the catalogue lacks is simply not evidence
        return None


def _points(r: StoredResult, dev: CatalogueDevice) -> list[DbPoint]:
    from strata.bench.explain import PREFILL_PASS

    ex = r.explain or {}
    if ex.get("host_busy") or ex.get("cache_resident"):
        return []
    if dev.cache_bytes and (ex.get("bytes_per_token") or 0) < dev.cache_bytes:
        return []  # it lived in the cache: per-token overhead, not the memory roof
    out = []
    for phase, metric, flops in (("decode", "decode_tps", "flops_per_decode_token"),
                                 ("prefill", "prefill_tps", "flops_per_prompt_token")):
        tps = (r.metrics.get(metric) or {}).get("mean")
        if not tps or not ex.get("bytes_per_token"):
            continue
        per_pass = max(1, min(r.n_prompt, PREFILL_PASS)) if phase == "prefill" else 1
        out.append(DbPoint(dev, EtaSource(r.id, r.run_id, r.model, r.test, 0.0), phase,
                           float(ex["bytes_per_token"]), float(ex.get(flops) or 0),
                           ex.get("compute_dtype"), per_pass, 1.0 / float(tps)))
    return out


def db_points(conn: sqlite3.Connection) -> list[DbPoint]:
    """Every stored result on a device the catalogue knows, from every stored host."""
    from strata.store.hosts import list_hosts, load_host
    from strata.store.runs import query_results

    out = []
    for host in list_hosts(conn):
        profile = load_host(conn, host.fingerprint)
        if profile is None:
            continue
        for r in query_results(conn, fingerprint=host.fingerprint):
            dev = _device_of(profile, (r.explain or {}).get("device", ""))
            if dev is not None:
                out.extend(_points(r, dev))
    return out


@dataclass
class Evidence:
    """What strata knows to predict any catalogue device: DB points and published fits."""

    published: Published
    points: list[DbPoint] = field(default_factory=list)

    def speed(self, dev: CatalogueDevice, phase: str, dtype: str | None = None) -> Speed:
        """`dtype`: the compute roof's dtype (prefill's η is fitted per dtype)."""
        mine = [p for p in self.points if p.phase == phase]
        same = [p for p in mine if p.device.id == dev.id]
        if same:
            return _from_db(dev, phase, same, TIERS[0])
        family = [p for p in mine if p.device.arch == dev.arch]
        if family:
            return _from_db(dev, phase, family, TIERS[1])
        fit = self.published.get(dev.device_class, phase, dtype)
        if fit is not None:
            return Speed(phase, fit.eta, fit.c_s, fit.low, fit.high, "published", fit.basis)
        if phase == "prefill" and dev.device_class != "cpu":  # a GPU's datasheet FLOP/s
            return self._other_classes(dtype)  # peak is reached far less than 0.7 of it
        return self._same_memory(dev) or prior(phase)

    def _same_memory(self, dev: CatalogueDevice) -> Speed | None:
        """Decode of a GPU class without published rows: the fit of another vendor's GPUs
        with the same memory technology (GDDR/LPDDR or HBM): the per-token cost c of a GPU
        runtime is not zero, which the prior would assume."""
        if dev.device_class in ("cpu", "apple"):
            return None
        tech = dev.device_class.rsplit("-", 1)[-1]
        fits = [f for (cls, phase, _), f in self.published.fits.items()
                if phase == "decode" and cls.endswith(f"-{tech}") and cls != dev.device_class]
        if not fits:
            return None
        fit = max(fits, key=lambda f: f.n)
        # another vendor's software: at least the prior's spread around the estimate
        low, high = min(fit.low, PRIOR_LOW / PRIOR_ETA), max(fit.high, PRIOR_HIGH / PRIOR_ETA)
        return Speed("decode", fit.eta, fit.c_s, low, high, "published, other vendor",
                     f"published, other vendor: {fit.basis.removeprefix('published: ')} "
                     f"(none published for "
                     f"{dev.device_class}; same memory technology)")

    def _other_classes(self, dtype: str | None) -> Speed:
        fits = [f for (_, phase, d), f in self.published.fits.items()
                if phase == "prefill" and d == dtype]
        if not fits:
            return Speed("prefill", PRIOR_ETA, 0.0, PRIOR_LOW / PRIOR_ETA,
                         PRIOR_HIGH / PRIOR_ETA, "prior", prior("prefill").basis)
        etas = sorted(f.eta for f in fits)
        eta = statistics.median(etas)
        return Speed("prefill", eta, 0.0, etas[0] / eta, etas[-1] / eta,
                     "published, other classes",
                     f"published, other classes: median η {eta:.2f} of the {dtype} prefill "
                     f"fits of {', '.join(sorted(f.device_class for f in fits))} (none "
                     "published for this class)")


def _from_db(dev: CatalogueDevice, phase: str, points: list[DbPoint], tier: str) -> Speed:
    pairs = [(p, p.ideal_s(dev)) for p in points]
    pairs = [(p, x) for p, x in pairs if x]
    if not pairs:
        return prior(phase)
    if phase == "decode":
        eta, c = fit_decode([x for _, x in pairs], [p.measured_s for p, _ in pairs])
    else:
        eta, c = statistics.median(x * (1 / p.measured_s) for p, x in pairs), 0.0
    ratios = [(x / eta + c) / p.measured_s for p, x in pairs]
    low, high = min(ratios), max(ratios)
    sources = tuple(EtaSource(p.source.result_id, p.source.run_id, p.source.model,
                              p.source.test, x / p.measured_s) for p, x in pairs)
    on = {p.device.id for p, _ in pairs}
    c_text = f", c {c * 1e3:.2f} ms/token" if phase == "decode" else ""
    basis = (f"{tier}: η {eta:.2f}{c_text} from {len(pairs)} stored {phase} result"
             f"{'s' if len(pairs) > 1 else ''} on {', '.join(sorted(on))} against "
             f"{dev.id}'s datasheet")
    return Speed(phase, eta, c, min(low, 1.0), max(high, 1.0), tier, basis, sources)

