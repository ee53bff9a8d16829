"""A small SVG plotting module: linear/log scales, axes, lines, markers, reference lines.

The report must open with no network and no plotting dependency, so charts are inline SVG
written here. Everything that reaches the SVG as text goes through `esc`: series names and
tooltips carry model names, which come from users.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field

# Okabe-Ito: distinguishable for the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#F0E442")
REF_COLOR = "#555555"
FONT_PX = 12
# Typographic signs as escapes: ruff (RUF001) flags the literal characters as ambiguous.
TIMES = "\u00d7"  # multiplication sign
EN_DASH = "\u2013"
CHAR_PX = 6.6  # rough advance width of the sans-serif font at FONT_PX, for label placement


def esc(text: object) -> str:
    """Escape for HTML/SVG text and double- or single-quoted attributes."""
    return html.escape(str(text), quote=True)


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def fmt_num(v: float, digits: int = 3) -> str:
    """Short label without exponents: 1.5k, 20M, 0.05, 3, 1e-05 only below 0.001."""
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    a = abs(v)
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= scale:
            return f"{v / scale:.{digits}g}{suffix}"
    if a >= 1e-3:
        return f"{v:.{digits}f}".rstrip("0").rstrip(".") if a < 1 else f"{v:.{digits}g}"
    return f"{v:.{digits}g}"


# ---------------------------------------------------------------------------- scales


@dataclass
class LinearScale:
    """Maps the domain [lo, hi] onto the pixel range [a, b] (b < a for a y axis)."""

    lo: float
    hi: float
    a: float = 0.0
    b: float = 1.0

    def __call__(self, v: float) -> float:
        span = self.hi - self.lo or 1.0
        return self.a + (v - self.lo) / span * (self.b - self.a)

    def ticks(self, n: int = 5) -> list[float]:
        step = nice_step((self.hi - self.lo) / max(n, 1))
        first = math.ceil(self.lo / step - 1e-9)
        last = math.floor(self.hi / step + 1e-9)
        decimals = max(0, -math.floor(math.log10(step)))  # avoid 0.30000000000000004
        return [round(i * step, decimals) for i in range(first, last + 1)]


@dataclass
class LogScale:
    """Base-10 log scale; the domain must be positive (callers drop values <= 0)."""

    lo: float
    hi: float
    a: float = 0.0
    b: float = 1.0

    def __call__(self, v: float) -> float:
        l0, l1 = math.log10(self.lo), math.log10(self.hi)
        span = l1 - l0 or 1.0
        return self.a + (math.log10(max(v, 1e-300)) - l0) / span * (self.b - self.a)

    def ticks(self, n: int = 5) -> list[float]:
        """Decades; with fewer than three decades in view, also 2x and 5x multiples."""
        k0 = math.floor(math.log10(self.lo) + 1e-9)
        k1 = math.ceil(math.log10(self.hi) - 1e-9)
        mults = (1,) if k1 - k0 >= 3 else (1, 2, 5)
        out = [m * 10.0 ** k for k in range(k0, k1 + 1) for m in mults]
        inside = [t for t in out if self.lo * (1 - 1e-9) <= t <= self.hi * (1 + 1e-9)]
        if len(inside) > 2 * n:  # many decades: label every other one
            inside = inside[::2]
        return inside


Scale = LinearScale | LogScale


def nice_step(raw: float) -> float:
    """The 1-2-5 x 10^k step nearest above `raw`, so tick labels stay short."""
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw * (1 - 1e-9):
            return m * power
    return 10 * power


def linear_domain(values: list[float], zero: bool = False) -> tuple[float, float]:
    """Rounded-out [lo, hi] covering `values` (and 0 when `zero`), never empty."""
    lo, hi = min(values), max(values)
    if zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if lo == hi:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step((hi - lo) / 10)  # round out finely: coarse rounding wastes the plot
    return math.floor(lo / step) * step, math.ceil(hi / step) * step


def log_domain(values: list[float], tight: bool = False) -> tuple[float, float]:
    """Whole decades covering the positive `values` (tight: 25% margins instead, for x axes
    whose values, like prompt sizes 16..256, would leave most of two decades empty)."""
    pos = [v for v in values if v > 0]
    if not pos:
        return 1.0, 10.0
    if tight:
        return min(pos) / 1.25, max(pos) * 1.25
    lo = 10.0 ** math.floor(math.log10(min(pos)))
    hi = 10.0 ** math.ceil(math.log10(max(pos)))
    return (lo / 10, hi * 10) if lo == hi else (lo, hi)  # one value: centre it


def wants_log(values: list[float], ratio: float = 30.0) -> bool:
    """A log axis when positive values span more than `ratio`x (e.g. two backends 50x apart)."""
    pos = [v for v in values if v > 0]
    return len(pos) == len(values) and len(pos) > 1 and max(pos) / min(pos) > ratio


# ---------------------------------------------------------------------------- chart parts


@dataclass
class Series:
    """Data drawn as markers (one <circle> per point) and optionally joined by a line."""

    name: str
    points: list[tuple[float, float]]
    color: str
    line: bool = True
    errors: list[float] | None = None  # +/- on y per point (sample SD), drawn as whiskers
    tips: list[str] | None = None  # tooltip per point (<title>)
    hollow: bool = False
    labels: list[str] | None = None  # short text written next to each marker


@dataclass
class RefLine:
    """A reference polyline in data coordinates (roofline ceilings, window means)."""

    name: str
    points: list[tuple[float, float]]
    color: str = REF_COLOR
    dash: str | None = None
    label: str | None = None  # written above the line's last point (or first, see label_at)
    label_at: str = "end"  # "start" keeps labels of near-equal lines from overprinting


@dataclass
class Band:
    """A shaded x-range across the plot (a time window, a throttled interval)."""

    x0: float
    x1: float
    fill: str
    label: str = ""


@dataclass
class Area:
    """A filled band between two curves sharing x (a min-max envelope)."""

    name: str
    xs: list[float]
    lo: list[float]
    hi: list[float]
    fill: str


@dataclass
class Margins:
    left: int = 64
    right: int = 16
    top: int = 28
    bottom: int = 44


@dataclass
class Chart:
    title: str
    x_label: str  # with units: "arithmetic intensity (FLOP/byte)"
    y_label: str
    series: list[Series] = field(default_factory=list)
    lines: list[RefLine] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    areas: list[Area] = field(default_factory=list)
    x_log: bool = False
    y_log: bool = False
    x_domain: tuple[float, float] | None = None
    y_domain: tuple[float, float] | None = None
    y_zero: bool = True  # linear y axes start at 0 so bar-like readings are not exaggerated
    width: int = 560
    height: int = 320
    margins: Margins = field(default_factory=Margins)
    uid: str = "chart"  # unique within the page: names the clip path

    @property
    def n_points(self) -> int:
        return sum(len(s.points) for s in self.series)

    def render(self) -> str:
        return render_chart(self)


# ---------------------------------------------------------------------------- rendering


def _usable(v: float, log: bool) -> bool:
    return math.isfinite(v) and (v > 0 or not log)


def _visible(chart: Chart, pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points that can be placed on this chart's axes (no NaN, nothing <= 0 on a log axis)."""
    return [(x, y) for x, y in pts if _usable(x, chart.x_log) and _usable(y, chart.y_log)]


def _domain(chart: Chart, axis: int) -> tuple[float, float]:
    given = chart.x_domain if axis == 0 else chart.y_domain
    if given:
        return given
    log = chart.x_log if axis == 0 else chart.y_log
    vals = [p[axis] for s in chart.series for p in _visible(chart, s.points)]
    if axis == 1:  # whiskers must fit too
        for s in chart.series:
            for (x, y), e in zip(s.points, s.errors or [0.0] * len(s.points), strict=False):
                if _usable(x, chart.x_log) and _usable(y, chart.y_log):
                    vals += [v for v in (y - e, y + e) if _usable(v, log)]
    vals += [p[axis] for ln in chart.lines for p in _visible(chart, ln.points)]
    vals += [v for b in chart.bands for v in (b.x0, b.x1)] if axis == 0 else []
    for a in chart.areas:
        vals += [v for v in (a.xs if axis == 0 else a.lo + a.hi) if _usable(v, log)]
    if not vals:
        return (1.0, 10.0) if log else (0.0, 1.0)
    if log:
        return log_domain(vals, tight=axis == 0)
    if axis == 1:  # headroom: a top marker should not sit on the frame
        vals.append(max(vals) + 0.04 * (max(vals) - min(vals)))
    lo, hi = linear_domain(vals, zero=chart.y_zero and axis == 1)
    if axis == 0:  # air on both sides, so the first and last markers are not on the frame
        pad = (hi - lo) * 0.03
        lo, hi = lo - pad, hi + pad
    return lo, hi


def scales(chart: Chart) -> tuple[Scale, Scale]:
    m = chart.margins
    (x0, x1), (y0, y1) = _domain(chart, 0), _domain(chart, 1)
    xs: Scale = (LogScale if chart.x_log else LinearScale)(x0, x1, m.left, chart.width - m.right)
    ys: Scale = (LogScale if chart.y_log else LinearScale)(y0, y1, chart.height - m.bottom, m.top)
    return xs, ys


def _f(v: float) -> str:
    return f"{v:.1f}"


def _axes(chart: Chart, xs: Scale, ys: Scale) -> list[str]:
    m, w, h = chart.margins, chart.width, chart.height
    out = [f'<g class="axes" font-size="{FONT_PX - 1}">']
    for t in xs.ticks(6):
        x = _f(xs(t))
        out.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{m.top}" y2="{h - m.bottom}"/>')
        out.append(f'<text x="{x}" y="{h - m.bottom + 14}" text-anchor="middle">'
                   f"{esc(fmt_num(t))}</text>")
    for t in ys.ticks(5):
        y = _f(ys(t))
        out.append(f'<line class="grid" x1="{m.left}" x2="{w - m.right}" y1="{y}" y2="{y}"/>')
        out.append(f'<text x="{m.left - 6}" y="{y}" dy="0.32em" text-anchor="end">'
                   f"{esc(fmt_num(t))}</text>")
    out.append(f'<rect class="frame" x="{m.left}" y="{m.top}" width="{w - m.left - m.right}" '
               f'height="{h - m.top - m.bottom}"/>')
    out.append(f'<text class="label" x="{(m.left + w - m.right) / 2:.1f}" y="{h - 8}" '
               f'text-anchor="middle">{esc(chart.x_label)}</text>')
    cy = (m.top + h - m.bottom) / 2
    out.append(f'<text class="label" transform="translate(14 {cy:.1f}) rotate(-90)" '
               f'text-anchor="middle">{esc(chart.y_label)}</text>')
    out.append("</g>")
    return out


def _path(pts: list[tuple[float, float]], xs: Scale, ys: Scale) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'}{_f(xs(x))},{_f(ys(y))}"
                    for i, (x, y) in enumerate(pts))


def _band(chart: Chart, b: Band, xs: Scale) -> str:
    m = chart.margins
    x0, x1 = sorted((xs(b.x0), xs(b.x1)))
    title = f"<title>{esc(b.label)}</title>" if b.label else ""
    return (f'<rect class="band" x="{_f(x0)}" y="{m.top}" width="{_f(max(x1 - x0, 1.0))}" '
            f'height="{chart.height - m.top - m.bottom}" fill="{esc(b.fill)}">{title}</rect>')


def _area(chart: Chart, a: Area, xs: Scale, ys: Scale) -> str:
    upper = [(x, y) for x, y in zip(a.xs, a.hi, strict=False)]
    lower = [(x, y) for x, y in zip(a.xs, a.lo, strict=False)][::-1]
    pts = _visible(chart, upper + lower)
    if len(pts) < 3:
        return ""
    return (f'<path class="area" d="{_path(pts, xs, ys)} Z" fill="{esc(a.fill)}">'
            f"<title>{esc(a.name)}</title></path>")


def _ref_line(chart: Chart, ln: RefLine, xs: Scale, ys: Scale) -> list[str]:
    pts = _visible(chart, ln.points)
    if len(pts) < 2:
        return []
    dash = f' stroke-dasharray="{esc(ln.dash)}"' if ln.dash else ""
    out = [f'<path class="ref" d="{_path(pts, xs, ys)}" stroke="{esc(ln.color)}"{dash}>'
           f"<title>{esc(ln.name)}</title></path>"]
    if ln.label:
        start = ln.label_at == "start"
        x, y = xs(pts[0 if start else -1][0]), ys(pts[0 if start else -1][1])
        out.append(f'<text class="reflabel" x="{_f(x + 4 if start else x - 4)}" y="{_f(y - 5)}" '
                   f'text-anchor="{"start" if start else "end"}" fill="{esc(ln.color)}">'
                   f"{esc(ln.label)}</text>")
    return out


def _series(chart: Chart, s: Series, xs: Scale, ys: Scale) -> list[str]:
    idx = [i for i, (x, y) in enumerate(s.points)
           if _usable(x, chart.x_log) and _usable(y, chart.y_log)]
    pts = [s.points[i] for i in idx]
    out = [f'<g class="series" data-name="{esc(s.name)}">']
    if s.line and len(pts) > 1:
        out.append(f'<path class="line" d="{_path(pts, xs, ys)}" stroke="{esc(s.color)}"/>')
    for i in idx:
        x, y = s.points[i]
        err = s.errors[i] if s.errors and i < len(s.errors) else 0.0
        if err and math.isfinite(err):
            lo = y - err if _usable(y - err, chart.y_log) else y
            out.append(f'<path class="err" d="M{_f(xs(x))},{_f(ys(lo))} '
                       f'L{_f(xs(x))},{_f(ys(y + err))}" stroke="{esc(s.color)}"/>')
        fill = "#fff" if s.hollow else esc(s.color)
        tip = s.tips[i] if s.tips and i < len(s.tips) else f"{s.name}: {fmt_num(x)}, {fmt_num(y)}"
        out.append(f'<circle class="pt" cx="{_f(xs(x))}" cy="{_f(ys(y))}" r="3.6" '
                   f'fill="{fill}" stroke="{esc(s.color)}"><title>{esc(tip)}</title></circle>')
        if s.labels and i < len(s.labels) and s.labels[i]:
            out.append(f'<text class="ptlabel" x="{_f(xs(x) + 6)}" y="{_f(ys(y) - 6)}">'
                       f"{esc(s.labels[i])}</text>")
    out.append("</g>")
    return out


def render_chart(chart: Chart) -> str:
    """The chart as one <svg> element (inline in HTML, scales with its container)."""
    xs, ys = scales(chart)
    m, w, h = chart.margins, chart.width, chart.height
    clip = f"clip-{esc(chart.uid)}"
    out = [f'<svg class="plot" viewBox="0 0 {w} {h}" role="img" '
           f'aria-label="{esc(chart.title)}" font-family="inherit">',
           f'<defs><clipPath id="{clip}"><rect x="{m.left}" y="{m.top}" '
           f'width="{w - m.left - m.right}" height="{h - m.top - m.bottom}"/></clipPath></defs>',
           f'<text class="title" x="{m.left}" y="{m.top - 10}">{esc(chart.title)}</text>']
    out += _axes(chart, xs, ys)
    out.append(f'<g clip-path="url(#{clip})">')
    out += [_band(chart, b, xs) for b in chart.bands]
    out += [_area(chart, a, xs, ys) for a in chart.areas]
    for ln in chart.lines:
        out += _ref_line(chart, ln, xs, ys)
    out.append("</g>")
    for s in chart.series:  # markers unclipped: one on the frame edge stays a whole circle
        out += _series(chart, s, xs, ys)
    out.append("</svg>")
    return "\n".join(out)


def legend(entries: list[tuple[str, str, str]]) -> str:
    """HTML legend: (label, colour, style) with style 'marker', 'line', 'dash' or 'band'."""
    items = []
    for label, col, style in entries:
        items.append(f'<li><span class="sw sw-{esc(style)}" style="--c:{esc(col)}"></span>'
                     f"{esc(label)}</li>")
    return f'<ul class="legend">{"".join(items)}</ul>' if items else ""
