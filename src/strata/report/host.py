"""The host card: what the machine is, whether its stack can drive each device, its roofline.

Figures are formatted by the same helpers as `strata probe`, so the terminal and the page
never disagree about a number.
"""

from __future__ import annotations

from strata.hardware.profile import CpuInfo, GpuInfo, HostProfile, SoftwareStack, SupportVerdict
from strata.hardware.software import llama_cpp_text
from strata.measure.peak import trust_lines
from strata.measure.roofline import Roofline
from strata.report.data import ReportData
from strata.report.html import Raw, Section, badge, details, empty, kv_table, note, table
from strata.views.probe import cache_summary, device_rows

STATUS_BADGE = {"supported": "supported", "partial": "partial", "unsupported": "unsupported"}


def _gib(n: int | None) -> str | None:
    return f"{n / (1 << 30):.1f} GiB" if n else None


def cpu_card(cpu: CpuInfo) -> Raw:
    clock = cpu.freq_mhz_max or cpu.freq_mhz_nominal
    return kv_table([
        ("model", f"{cpu.vendor or '?'} {cpu.model or '?'} ({cpu.arch})"),
        ("cores / threads", f"{cpu.physical_cores or '?'} / {cpu.logical_threads or '?'}"),
        ("clock", f"{clock:.0f} MHz" if clock else None),
        ("caches", cache_summary(cpu)),
        ("NUMA nodes", cpu.numa_nodes),
        ("ISA", " ".join(cpu.isa) or "none of the tracked features"),
        ("RAM", f"{_gib(cpu.ram_total_bytes) or '?'} total, "
                f"{_gib(cpu.ram_available_bytes) or '?'} available at probe time"),
    ])


def gpu_card(gpus: list[GpuInfo]) -> Raw:
    if not gpus:
        return note("no GPU found (strata probe names what it looked for under 'not learned')")
    return table(["device", "name", "arch", "memory", "bus", "driver", "via"],
                 [(g.key, g.name, g.arch, _gib(g.memory_total_bytes),
                   f"{g.bus_width_bits} bit" if g.bus_width_bits else None, g.driver_version,
                   g.source) for g in gpus])


def software_card(sw: SoftwareStack) -> Raw:
    return kv_table([
        ("python", sw.python), ("os", sw.os), ("strata", sw.strata),
        ("torch", f"{sw.torch} ({sw.torch_build})" if sw.torch else "not installed"),
        ("torch arch list", " ".join(sw.torch_arch_list) or None),
        ("llama.cpp", llama_cpp_text(sw)),  # what `strata probe` prints, word for word
        ("triton", sw.triton or "not installed"),
        ("nvidia driver", sw.nvidia_driver), ("AMD driver", sw.amd_driver),
        ("env", " ".join(f"{k}={v}" for k, v in sw.env.items()) or None),
    ])


def verdict_card(verdicts: list[SupportVerdict]) -> Raw:
    if not verdicts:
        return note("no support verdicts stored (strata probe computes them)")
    rows = []
    for v in verdicts:
        why = "; ".join(v.reasons) + (f" — remedy: {v.remedy}" if v.remedy else "")
        rows.append((v.device, badge(v.status, STATUS_BADGE.get(v.status, "unknown")),
                     ", ".join(v.works) or None, ", ".join(v.fails) or None, why or None))
    return table(["device", "status", "works", "fails", "why / remedy"], rows)


def roofline_card(roof: Roofline | None) -> Raw:
    if roof is None:
        return empty("no roofline measured for this host yet", "strata probe --measure")
    rows = [row for dev in roof.devices for row in device_rows(dev)]
    parts = [table(["device", "figure", "best", "median", "theoretical", "fraction", "method"],
                   rows, cls="num")]
    for dev in roof.devices:
        ridges = ", ".join(f"{d} {dev.ridge_point(d):.3g}" for d in dev.compute
                           if dev.ridge_point(d))
        if ridges:
            parts.append(note(f"{dev.device}: ridge point (FLOP/byte) {ridges}"))
        parts += [note(f"{dev.device}: {n}") for n in dev.notes]
        parts += [note(f"{dev.device} {k}: {why}") for k, why in dev.unknown.items()]
    if roof.measured_busy:
        parts.append(Raw(badge("measured on a busy host", "bad")))
    parts += [note(line) for line in trust_lines(roof)]
    parts.append(note(f"measured in {roof.seconds:.1f} s"))
    return Raw("".join(parts))


def unknown_rows(p: HostProfile) -> list[tuple[str, str]]:
    rows = [(f"cpu.{k}", v) for k, v in p.cpu.unknown.items()] + list(p.unknown.items())
    rows += [(f"software.{k}", v) for k, v in p.software.unknown.items()]
    for g in p.gpus:
        rows += [(f"{g.key}.{k}", v) for k, v in g.unknown.items()]
    return rows


def host_section(data: ReportData) -> Section:
    p, h = data.profile, data.host
    head = note(f"{h.hostname} · fingerprint {h.fingerprint} · first seen {h.first_seen} · "
                f"last probed {h.last_seen}")
    if p is None:
        return Section("host", "Host", head + empty("no host profile stored", "strata probe"),
                       False)
    cards = (f'<div class="cards"><div><h3>CPU</h3>{cpu_card(p.cpu)}</div>'
             f"<div><h3>Software</h3>{software_card(p.software)}</div></div>"
             f"<h3>GPUs</h3>{gpu_card(p.gpus)}"
             f"<h3>Support verdicts</h3>{verdict_card(p.verdicts)}"
             f"<h3>Roofline figures</h3>{roofline_card(data.roofline)}")
    missing = unknown_rows(p)
    if missing:
        cards += details(f"not learned ({len(missing)}) and why", table(["what", "why"], missing))
    return Section("host", "Host", head + cards, True)
