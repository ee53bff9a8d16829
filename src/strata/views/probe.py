"""Terminal views of a HostProfile and a Roofline."""

from __future__ import annotations

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from strata.hardware.profile import CpuInfo, HostProfile, SupportVerdict
from strata.hardware.software import llama_cpp_text
from strata.measure.roofline import DeviceRoofline, Roofline
from strata.views.console import plain

STATUS_STYLE = {"supported": "green", "partial": "yellow", "unsupported": "bold red",
                "unknown": "dim"}


def _gib(n: int | None) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n else "?"


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def cache_summary(cpu: CpuInfo) -> str:
    parts = []
    for c in cpu.caches:
        kind = {"data": "d", "instruction": "i"}.get(c.kind, "")
        each = f" x{c.instances}" if c.instances > 1 else ""
        parts.append(f"L{c.level}{kind} {_size(c.size_bytes)}{each}")
    return ", ".join(parts) or "?"


def cpu_table(cpu: CpuInfo) -> Table:
    t = Table(title="CPU", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    clock = cpu.freq_mhz_max or cpu.freq_mhz_nominal
    rows = [
        ("model", f"{cpu.vendor or '?'} {cpu.model or '?'} ({cpu.arch})"),
        ("cores / threads", f"{cpu.physical_cores or '?'} / {cpu.logical_threads or '?'}"),
        ("clock", f"{clock:.0f} MHz ({'max' if cpu.freq_mhz_max else 'reported'})"
         if clock else "?"),
        ("caches", cache_summary(cpu)),
        ("NUMA nodes", str(cpu.numa_nodes or "?")),
        ("ISA", " ".join(cpu.isa) or "none of the tracked features"),
        ("RAM", f"{_gib(cpu.ram_total_bytes)} total, {_gib(cpu.ram_available_bytes)} available"),
    ]
    for k, v in rows:
        t.add_row(k, plain(v))
    return t


def gpu_table(profile: HostProfile) -> Table | Text:
    if not profile.gpus:
        return Text("GPUs: none found", style="dim")
    t = Table(title="GPUs", title_justify="left")
    for col in ("device", "name", "arch", "memory", "bus", "driver", "via"):
        t.add_column(col)
    for g in profile.gpus:
        bus = f"{g.bus_width_bits} bit" if g.bus_width_bits else "?"
        t.add_row(g.key, plain(g.name), plain(g.arch or "?"), _gib(g.memory_total_bytes), bus,
                  plain(g.driver_version or "?"), plain(g.source))
    return t


def software_table(profile: HostProfile) -> Table:
    sw = profile.software
    t = Table(title="Software", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    arch = " ".join(sw.torch_arch_list) if sw.torch_arch_list else "-"
    for k, v in (("python", sw.python), ("os", sw.os), ("strata", sw.strata),
                 ("torch", f"{sw.torch} ({sw.torch_build})" if sw.torch else "not installed"),
                 ("torch arch list", arch), ("llama.cpp", llama_cpp_text(sw)),
                 ("triton", sw.triton or "not installed"),
                 ("nvidia driver", sw.nvidia_driver or "-"), ("env", _env(sw.env))):
        t.add_row(k, plain(v))
    return t


def _env(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items()) or "-"


def verdict_table(verdicts: list[SupportVerdict]) -> Table:
    t = Table(title="Support verdict", title_justify="left")
    for col in ("device", "status", "works", "fails", "why / remedy"):
        t.add_column(col, overflow="fold")
    for v in verdicts:
        why = Text("; ".join(v.reasons))  # reasons quote error text: never markup
        if v.remedy:
            why.append("\nremedy:", style="bold").append(f" {v.remedy}")
        t.add_row(v.device, Text(v.status, style=STATUS_STYLE.get(v.status, "")),
                  plain(", ".join(v.works) or "-"), plain(", ".join(v.fails) or "-"), why)
    return t


def unknown_table(profile: HostProfile) -> Table | None:
    rows = [(f"cpu.{k}", v) for k, v in profile.cpu.unknown.items()]
    rows += list(profile.unknown.items())
    rows += [(f"software.{k}", v) for k, v in profile.software.unknown.items()]
    for g in profile.gpus:
        rows += [(f"{g.key}.{k}", v) for k, v in g.unknown.items()]
    if not rows:
        return None
    t = Table(title="Not learned (and why)", title_justify="left", style="dim")
    t.add_column("what")
    t.add_column("why", overflow="fold")
    for k, v in rows:
        t.add_row(k, plain(v))
    return t


def render_profile(console: Console, profile: HostProfile) -> None:
    parts = [cpu_table(profile.cpu), gpu_table(profile), software_table(profile),
             verdict_table(profile.verdicts)]
    missing = unknown_table(profile)
    if missing is not None:
        parts.append(missing)
    console.print(Group(*parts))
    console.print(f"host fingerprint [bold]{profile.fingerprint()}[/bold]")


def _unit(kind: str, name: str) -> str:
    return "GB/s" if kind == "bandwidth" else ("GOP/s" if name == "int8" else "GFLOP/s")


def device_rows(dev: DeviceRoofline) -> list[tuple[str, ...]]:
    rows = []
    for kind, figures in (("bandwidth", dev.bandwidth), ("compute", dev.compute)):
        for name, fig in figures.items():
            peak = dev.peak_bandwidth if kind == "bandwidth" else dev.peak_compute.get(name)
            on_device = kind == "compute" or name in DeviceRoofline._ON_DEVICE
            frac = dev.fraction_of_peak(kind, name) if on_device else None
            rows.append((dev.device, f"{name} ({_unit(kind, name)})", f"{fig.value:,.1f}",
                         f"{fig.median:,.1f}" if fig.median else "-",
                         f"{peak.value:,.1f}" if peak and on_device else "-",
                         f"{frac:.2f}" if frac else "-", fig.method))
    return rows


def roofline_table(roofline: Roofline) -> Table:
    t = Table(title=f"Roofline (measured in {roofline.seconds:.1f} s)", title_justify="left")
    for col in ("device", "figure", "best", "median", "theoretical", "fraction", "method"):
        t.add_column(col, overflow="fold")
    for dev in roofline.devices:
        for row in device_rows(dev):
            t.add_row(*map(plain, row))
    return t


def ridge_lines(roofline: Roofline) -> list[str]:
    lines = []
    for dev in roofline.devices:
        bw = dev.peak_bandwidth_gbs()
        ridges = ", ".join(f"{d} {dev.ridge_point(d):.3g}" for d in dev.compute
                           if dev.ridge_point(d))
        lines.append(f"{dev.device}: peak bandwidth {bw:,.1f} GB/s" if bw else
                     f"{dev.device}: bandwidth not measured")
        if ridges:
            lines[-1] += f"; ridge point (FLOP/byte) {ridges}"
        lines += [f"  [yellow]note:[/yellow] {escape(note)}" for note in dev.notes]
        for key, why in dev.unknown.items():
            lines.append(f"  [dim]{escape(f'{key}: {why}')}[/dim]")
    return lines


def render_roofline(console: Console, roofline: Roofline) -> None:
    console.print(roofline_table(roofline))
    for line in ridge_lines(roofline):
        console.print(line)
    for key, why in roofline.unknown.items():
        console.print(plain(f"{key}: {why}", style="dim"))
