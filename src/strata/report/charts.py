"""The measured charts: roofline with every result, t/s sweeps, sustained-run timelines."""

from __future__ import annotations

from dataclasses import dataclass

from strata.hardware.watch import format_value
from strata.measure.roofline import DeviceRoofline, Roofline
from strata.report.data import ReportData
from strata.report.derive import (
    Sweep,
    bin_timeline,
    depth_sweeps,
    is_sustained,
    prompt_sweeps,
    roof_point,
    telemetry_series,
    throttled_times,
    varied,
)
from strata.report.html import Raw, Section, badge, empty, figure, note, table
from strata.report.svg import (
    TIMES,
    Area,
    Band,
    Chart,
    RefLine,
    Series,
    color,
    esc,
    fmt_num,
    log_domain,
    wants_log,
)
from strata.store.runs import StoredResult

DASHES = (None, "6 3", "2 3", "8 3 2 3")
ROOF_GREYS = ("#333333", "#7a4f9a", "#8a6d3b", "#3b6e8a")
BENCH = "strata bench MODEL"


@dataclass
class Palette:
    """One colour per backend across every chart, so llamacpp is the same blue everywhere."""

    backends: list[str]

    def __call__(self, backend: str) -> str:
        if backend not in self.backends:
            self.backends.append(backend)
        return color(self.backends.index(backend))


def palette_for(results: list[StoredResult]) -> Palette:
    return Palette(sorted({r.backend for r in results}))


# ---------------------------------------------------------------------------- roofline


def _roof_lines(dev: DeviceRoofline, x_lo: float, x_hi: float, tag: str,
                ink: str) -> list[RefLine]:
    """Bandwidth slope up to the highest ceiling, then one flat ceiling per dtype."""
    bw = dev.peak_bandwidth_gbs()
    lines: list[RefLine] = []
    ceilings = {d: f.value for d, f in dev.compute.items() if f.value > 0}
    if bw:
        top = max(ceilings.values(), default=bw * x_hi)
        lines.append(RefLine(f"{tag}memory bandwidth {bw:,.1f} GB/s",
                             [(x_lo, bw * x_lo), (top / bw, top)], ink,
                             label=f"{tag}{bw:,.1f} GB/s"))
    for i, (dtype, gflops) in enumerate(sorted(ceilings.items(), key=lambda kv: -kv[1])):
        x0 = gflops / bw if bw else x_lo
        unit = "GOP/s" if dtype == "int8" else "GFLOP/s"
        lines.append(RefLine(f"{tag}{dtype} matmul {gflops:,.1f} {unit}",
                             [(x0, gflops), (x_hi, gflops)], ink, dash=DASHES[i % 4] if i else None,
                             label=f"{tag}{dtype} {fmt_num(gflops)} {unit}"))
    for dtype, peak in dev.peak_compute.items():
        lines.append(RefLine(f"{tag}{dtype} theoretical peak {peak.value:,.1f} ({peak.basis})",
                             [(x_lo, peak.value), (x_hi, peak.value)], "#9aa3b2", dash="3 4",
                             label=f"{tag}{dtype} theoretical {fmt_num(peak.value)}",
                             label_at="start"))
    return lines


def _roof_domains(roof: Roofline, xs: list[float],
                  ys: list[float]) -> tuple[tuple[float, float], tuple[float, float]]:
    ridges = [r for d in roof.devices for r in (d.ridge_point(t) for t in d.compute) if r]
    ceilings = [f.value for d in roof.devices for f in d.compute.values()]
    ceilings += [p.value for d in roof.devices for p in d.peak_compute.values()]
    x_lo, x_hi = log_domain(xs + ridges or [0.1, 10.0])
    # x3 on the ceilings: their labels sit above the lines and need room below the frame top
    y_lo, y_hi = log_domain(ys + [c * 3 for c in ceilings] or [1.0, 10.0])
    return (x_lo, x_hi * 10), (y_lo, y_hi)  # a decade of room right of the ridge for labels


def _point_tip(r: StoredResult, intensity: float, gflops: float) -> str:
    ex = r.explain or {}
    eta = ex.get("prefill_eta") if r.n_prompt and not r.n_gen else ex.get("decode_eta")
    eta_s = f", η {eta:.2f}" if eta is not None else ""
    return (f"{r.model} · {r.backend} · {r.test}: {gflops:,.3g} GFLOP/s at "
            f"{intensity:.3g} FLOP/byte{eta_s} ({ex.get('bound') or '?'} bound)")


def roofline_chart(roof: Roofline, results: list[StoredResult], pal: Palette) -> tuple[Chart,
                                                                                     list, int]:
    """The chart, its legend entries, and how many results could not be placed."""
    points = [(r, roof_point(r)) for r in results]
    placed = [(r, p) for r, p in points if p]
    xs, ys = [p.intensity for _, p in placed], [p.gflops for _, p in placed]
    (x_lo, x_hi), y_dom = _roof_domains(roof, xs, ys)
    chart = Chart("Roofline: achieved vs attainable", "arithmetic intensity (FLOP/byte)",
                  "achieved (GFLOP/s)", x_log=True, y_log=True, x_domain=(x_lo, x_hi),
                  y_domain=y_dom, uid="chart-roofline", width=900, height=440)
    entries: list[tuple[str, str, str]] = []
    many = len(roof.devices) > 1
    for i, dev in enumerate(roof.devices):
        ink = ROOF_GREYS[i % len(ROOF_GREYS)]
        chart.lines += _roof_lines(dev, x_lo, x_hi, f"{dev.device} " if many else "", ink)
        entries.append((f"{dev.device} roof ({dev.name})", ink, "line"))
    for backend in sorted({r.backend for r, _ in placed}):
        for phase, hollow in (("prefill", False), ("decode", True)):
            mine = [(r, p) for r, p in placed if r.backend == backend
                    and (bool(r.n_gen) == hollow)]
            if not mine:
                continue
            chart.series.append(Series(
                f"{backend} {phase}", [(p.intensity, p.gflops) for _, p in mine], pal(backend),
                line=False, hollow=hollow,
                tips=[_point_tip(r, p.intensity, p.gflops) for r, p in mine]))
            entries.append((f"{backend} · {phase}", pal(backend), "hollow" if hollow else
                            "marker"))
    return chart, entries, len(points) - len(placed)


def roofline_section(data: ReportData, pal: Palette) -> Section:
    title = "Roofline"
    if data.roofline is None:
        return Section("roofline", title, empty("no roofline measured for this host yet",
                                                "strata probe --measure"), False)
    chart, entries, skipped = roofline_chart(data.roofline, data.results, pal)
    caption = (f"Each point is one bench result: intensity = FLOPs per token {TIMES} tokens "
               f"per weight pass / bytes per token; achieved = t/s {TIMES} FLOPs per token. "
               "Filled = prefill, hollow = decode. Lines: measured bandwidth slope and matmul "
               "ceilings per dtype; dashed grey: theoretical peaks.")
    body = [figure(chart, entries, caption)]
    if not chart.n_points:
        body.append(empty("no bench results to place on the roofline yet", BENCH))
    if skipped:
        body.append(note(f"{skipped} result(s) not placed: no byte/FLOP model (endpoints) or "
                         "no t/s figure."))
    return Section("roofline", title, "".join(body), chart.n_points > 0)


# ---------------------------------------------------------------------------- sweeps


def sweep_chart(sweeps: list[Sweep], title: str, x_label: str, uid: str,
                pal: Palette) -> tuple[Chart, list[tuple[str, str, str]]]:
    ys = [p.mean for s in sweeps for p in s.points]
    xs = [p.x for s in sweeps for p in s.points]
    chart = Chart(title, x_label, "tokens per second (t/s)", uid=uid, y_log=wants_log(ys),
                  x_log=wants_log(xs, ratio=8.0))
    entries = []
    seen: dict[str, int] = {}
    for s in sorted(sweeps, key=lambda s: (s.backend, s.model, s.fixed)):
        n = seen[s.backend] = seen.get(s.backend, -1) + 1
        col = pal(s.backend)
        chart.series.append(Series(
            s.name, [(p.x, p.mean) for p in s.points], col, line=len(s.points) > 1,
            errors=[p.sd for p in s.points], hollow=n > 0,
            tips=[f"{s.name} · {p.result.test}: {p.mean:,.1f} ± {p.sd:,.1f} t/s"
                  for p in s.points]))
        entries.append((s.name, col, "marker" if n == 0 else "hollow"))
    return chart, entries


def sweeps_section(data: ReportData, pal: Palette) -> Section:
    figs: list[Raw] = []
    missing: list[Raw] = []
    caption = "mean ± sample SD per test"
    for phase, what in (("pp", "prefill"), ("tg", "decode")):
        sweeps = depth_sweeps(data.results, phase)
        if varied(sweeps):
            chart, entries = sweep_chart(sweeps, f"{what} t/s vs depth", "depth: tokens "
                                         "already in the KV cache", f"chart-depth-{phase}", pal)
            figs.append(figure(chart, entries, caption))
    if not figs:
        missing.append(empty("no results at two or more depths yet", f"{BENCH} -d 0,512,2048"))
    sweeps = prompt_sweeps(data.results)
    if varied(sweeps):
        chart, entries = sweep_chart(sweeps, "prefill t/s vs prompt size",
                                     "prompt size (tokens)", "chart-prompt", pal)
        figs.append(figure(chart, entries, caption))
    else:
        missing.append(empty("no prefill results at two or more prompt sizes yet",
                             f"{BENCH} -p 128,512,2048"))
    body = (f'<div class="grid">{"".join(figs)}</div>' if figs else "") + "".join(missing)
    return Section("sweeps", "t/s vs depth and prompt size", body, bool(figs))


# ---------------------------------------------------------------------------- sustained

THROTTLE_FILL = "#c0392b"
WINDOW_FILL = "#56B4E9"


def _throttle_state(s: dict) -> tuple[str, str]:
    flag = s.get("throttled")
    if flag is True:
        return "throttling seen", "bad"
    if flag is False:
        return "no throttling seen", "ok"
    return "throttling unknown", "unknown"


def sustained_chart(r: StoredResult, i: int, pal: Palette) -> tuple[Chart, list]:
    s = r.info["sustained"]
    timeline = [(float(t), float(v)) for t, v in s.get("timeline") or []]
    end = timeline[-1][0] if timeline else float(s.get("seconds") or 1)
    win = float(s.get("window_s") or 0)
    chart = Chart("decode t/s over the run", "time since start (s)",
                  "decode t/s", uid=f"chart-sustained-{i}", width=900, height=300)
    entries = [("decode t/s per request", pal(r.backend), "line")]
    if win:
        chart.bands += [Band(0, win, WINDOW_FILL, f"first {win:g} s"),
                        Band(max(end - win, 0), end, WINDOW_FILL, f"last {win:g} s")]
        entries.append(("first / last window compared", WINDOW_FILL, "band"))
    for label, key, x0, x1 in (("first", "first_tps", 0, win), ("last", "last_tps",
                                                                 end - win, end)):
        if s.get(key) and win:
            chart.lines.append(RefLine(f"{label} {win:g} s mean {s[key]:,.1f} t/s",
                                       [(x0, s[key]), (x1, s[key])], "#333333", dash="5 3"))
    if s.get("throttled") is True:  # the verdict covers the run; mark it across the plot
        chart.bands.append(Band(0, end, THROTTLE_FILL, "throttling seen during this run: "
                                + "; ".join(s.get("evidence") or [])))
        entries.append(("throttled (whole run)", THROTTLE_FILL, "band"))
    for t in throttled_times(r.telemetry):  # per-sample marks where samples were stored
        chart.bands.append(Band(t - 0.1, t + 0.1, THROTTLE_FILL, f"throttle flag at {t:.1f} s"))
    bins = bin_timeline(timeline)
    if len(bins) < len(timeline):
        chart.areas.append(Area("min-max t/s per bin", [b.t for b in bins], [b.lo for b in bins],
                                [b.hi for b in bins], pal(r.backend)))
        entries[0] = (f"decode t/s, mean of {len(timeline)} requests in {len(bins)} bins",
                      pal(r.backend), "line")
        entries.append(("min-max per bin", pal(r.backend), "band"))
    chart.series.append(Series("decode t/s", [(b.t, b.mean) for b in bins], pal(r.backend),
                               tips=[f"{b.t:.2f} s: {b.mean:,.1f} t/s"
                                     + (f" (mean of {b.n}, {b.lo:,.0f}-{b.hi:,.0f})"
                                        if b.n > 1 else "") for b in bins]))
    if win and s.get("first_tps"):
        entries.append(("window means", "#333333", "dash"))
    return chart, entries


def _telemetry_charts(r: StoredResult, i: int) -> list[Raw]:
    out = []
    for unit, metrics in telemetry_series(r.telemetry).items():
        chart = Chart(f"telemetry ({unit})", "time since start (s)", unit,
                      uid=f"chart-tele-{i}-{unit.strip('°')}", y_zero=False, width=900,
                      height=240)
        entries = []
        for j, (key, pts) in enumerate(sorted(metrics.items())):
            chart.series.append(Series(key, pts, color(j)))
            entries.append((key, color(j), "line"))
        out.append(figure(chart, entries))
    return out


def _telemetry_table(tele: dict | None) -> Raw:
    metrics = (tele or {}).get("metrics") or {}
    rows = [(k, *(format_value(k, m[s]) if isinstance(m.get(s), int | float) else None
                  for s in ("min", "mean", "max")), m.get("n"))
            for k, m in sorted(metrics.items())]
    return table(["metric", "min", "mean", "max", "samples"], rows, cls="num") if rows else Raw("")


def sustained_block(r: StoredResult, i: int, pal: Palette) -> str:
    s = r.info["sustained"]
    chart, entries = sustained_chart(r, i, pal)
    state, kind = _throttle_state(s)
    drop = s.get("drop")
    cap = (f"first {s.get('window_s', 0):g} s {s['first_tps']:,.1f} t/s, last "
           f"{s['window_s']:g} s {s['last_tps']:,.1f} t/s, drop {drop:+.1%}"
           if drop is not None else "too few requests to compare windows")
    reason = ((r.telemetry or {}).get("verdict") or {}).get("reason")
    why = "; ".join(s.get("evidence") or []) or reason or ""
    name = f"{r.model} · {r.backend} · {r.test}"
    parts = [f"<h3>{badge(state, kind)} {esc(name)}</h3>", figure(chart, entries, cap)]
    if why:
        parts.append(note(f"{state}: {why}"))
    parts += _telemetry_charts(r, i)
    summary = _telemetry_table(r.telemetry)
    if not summary:
        parts.append(note("no telemetry stored with this result"))
    elif not telemetry_series(r.telemetry):
        parts.append(note("per-sample clock/temperature series are not stored with results; "
                          "the telemetry summary of this run:"))
    parts.append(summary)
    return "".join(parts)


def sustained_section(data: ReportData, pal: Palette) -> Section:
    runs = [r for r in data.results if is_sustained(r)]
    if not runs:
        return Section("sustained", "Sustained runs and throttling",
                       empty("no sustained runs yet", f"{BENCH} --sustained 300"), False)
    body = "".join(sustained_block(r, i, pal) for i, r in enumerate(runs))
    return Section("sustained", "Sustained runs and throttling", body, True)
