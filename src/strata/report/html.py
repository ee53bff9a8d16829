"""HTML building blocks: escaped-by-default tables, empty-section notes, figures, the page.

Every cell and caption is escaped unless it is wrapped in `Raw` (HTML built here from
escaped parts). The page declares a Content-Security-Policy that forbids scripts and every
network fetch: the report is data only, and a browser will refuse (and log) anything that
tries to load from elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from strata.report.svg import EN_DASH, Chart, esc, legend

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


class Raw(str):
    """Markup that is already safe (built from escaped parts); inserted as is."""


def cell(value: object) -> str:
    if value is None:
        return f'<span class="na">{EN_DASH}</span>'
    return value if isinstance(value, Raw) else esc(value)


@dataclass
class Section:
    id: str  # anchor, also what the browser test looks for
    title: str
    body: str
    has_data: bool


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], cls: str = "") -> Raw:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
                   for row in rows)
    # in its own scrolling box: a table wider than the page scrolls there, never clipped
    return Raw(f'<div class="tbl"><table class="{esc(cls)}"><thead><tr>{head}</tr></thead>'
               f"<tbody>{body}</tbody></table></div>")


def kv_table(rows: Iterable[tuple[str, object]]) -> Raw:
    body = "".join(f"<tr><th>{esc(k)}</th><td>{cell(v)}</td></tr>" for k, v in rows)
    return Raw(f'<div class="tbl"><table class="kv"><tbody>{body}</tbody></table></div>')


def empty(what: str, command: str) -> Raw:
    """The note a section shows without data: what is missing and the command that fills it."""
    return Raw(f'<p class="empty">{esc(what)} — run <code>{esc(command)}</code></p>')


def badge(text: str, kind: str) -> Raw:
    return Raw(f'<span class="badge b-{esc(kind)}">{esc(text)}</span>')


def note(text: str) -> Raw:
    return Raw(f'<p class="note">{esc(text)}</p>')


def figure(chart: Chart, entries: list[tuple[str, str, str]], caption: str = "") -> Raw:
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return Raw(f'<figure class="chart" id="{esc(chart.uid)}" data-points="{chart.n_points}">'
               f"{chart.render()}{legend(entries)}{cap}</figure>")


def details(summary: str, body: str) -> Raw:
    return Raw(f"<details><summary>{esc(summary)}</summary>{body}</details>")


def fmt(v: float | None, spec: str = ",.1f", suffix: str = "") -> str | None:
    return None if v is None else f"{v:{spec}}{suffix}"


CSS = """
:root { --fg:#1d2430; --muted:#5b6576; --line:#d9dee7; --bg:#f6f7f9; --card:#fff;
        --accent:#0072B2; }
* { box-sizing: border-box; }
body { margin:0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans",
       "DejaVu Sans", sans-serif; color:var(--fg); background:var(--bg); }
header { background:#1d2430; color:#fff; padding:18px 28px; }
header h1 { margin:0 0 4px; font-size:22px; }
header p { margin:2px 0; color:#c9d1dd; }
nav { position:sticky; top:0; z-index:1; background:#fff; border-bottom:1px solid var(--line);
      padding:8px 28px; display:flex; flex-wrap:wrap; gap:4px 16px; }
nav a { color:var(--accent); text-decoration:none; font-weight:600; }
nav a.nodata { color:var(--muted); font-weight:400; }
main { max-width:1240px; margin:0 auto; padding:12px 28px 40px; }
section { background:var(--card); border:1px solid var(--line); border-radius:8px;
          padding:14px 20px 18px; margin:18px 0; }
section > h2 { margin:0 0 10px; font-size:18px; }
h3 { font-size:15px; margin:14px 0 6px; }
h4 { font-size:13px; margin:10px 0 4px; color:var(--muted); }
.grid { display:grid; grid-template-columns:repeat(auto-fit, minmax(460px, 1fr)); gap:14px; }
.cards { display:grid; grid-template-columns:repeat(auto-fit, minmax(340px, 1fr)); gap:10px 24px; }
.tbl { overflow-x:auto; max-width:100%; }
table { border-collapse:collapse; width:100%; font-size:13px; margin:4px 0 8px; }
td { overflow-wrap:break-word; }
th, td { text-align:left; padding:4px 8px; border-bottom:1px solid var(--line);
         vertical-align:top; }
thead th { background:#eef1f5; font-weight:600; white-space:nowrap; }
tbody tr:nth-child(even) td { background:#fafbfc; }
table.kv th { width:34%; color:var(--muted); font-weight:600; }
td.num, table.num td { font-variant-numeric: tabular-nums; }
.na { color:#9aa3b2; }
.empty { color:var(--muted); background:#f3f5f8; border:1px dashed #c4cbd6; border-radius:6px;
         padding:10px 12px; margin:6px 0; }
.note { color:var(--muted); font-size:13px; margin:4px 0; }
.small { color:var(--muted); font-size:12px; }
code { background:#eef1f5; padding:1px 5px; border-radius:4px; font-size:12.5px; }
.badge { display:inline-block; padding:1px 8px; border-radius:10px; font-size:12px;
         font-weight:600; color:#fff; background:#7b8494; }
.b-supported, .b-ok { background:#1a7f45; } .b-partial, .b-warn { background:#b36b00; }
.b-unsupported, .b-bad { background:#c0392b; } .b-unknown { background:#7b8494; }
figure.chart { margin:0; border:1px solid var(--line); border-radius:6px; padding:8px 10px; }
figure.chart svg { width:100%; height:auto; display:block; }
figcaption { color:var(--muted); font-size:12.5px; margin-top:4px; }
svg .grid { stroke:#e6e9ef; stroke-width:1; }
svg .frame { fill:none; stroke:#aab2bf; }
svg .axes text { fill:#4a5465; }
svg .label { font-size:12px; fill:#1d2430; }
svg .title { font-size:13px; font-weight:600; fill:#1d2430; }
svg .line { fill:none; stroke-width:2; }
svg .ref { fill:none; stroke-width:1.6; }
svg .err { stroke-width:1.2; opacity:.7; }
svg .reflabel { font-size:11px; }
svg .ptlabel { font-size:11px; fill:#1d2430; }
svg .band { opacity:.16; }
svg .area { opacity:.22; stroke:none; }
svg circle.pt { stroke-width:1.6; }
ul.legend { list-style:none; padding:0; margin:6px 0 0; display:flex; flex-wrap:wrap;
            gap:2px 14px; font-size:12.5px; }
.sw { display:inline-block; width:18px; height:10px; margin-right:5px; vertical-align:middle; }
.sw-marker { width:10px; border-radius:50%; background:var(--c); }
.sw-hollow { width:10px; border-radius:50%; border:2px solid var(--c); background:#fff; }
.sw-line { height:3px; background:var(--c); }
.sw-dash { height:0; border-top:3px dashed var(--c); }
.sw-band { background:var(--c); opacity:.35; }
details summary { cursor:pointer; color:var(--accent); }
footer { color:var(--muted); font-size:12px; text-align:center; padding:10px; }
"""


def page(title: str, header: str, sections: list[Section], footer: str) -> str:
    nav = "".join(f'<a href="#{esc(s.id)}" class="{"" if s.has_data else "nodata"}">'
                  f"{esc(s.title)}</a>" for s in sections)
    body = "".join(f'<section id="{esc(s.id)}" data-has-data="{str(s.has_data).lower()}">'
                   f"<h2>{esc(s.title)}</h2>{s.body}</section>" for s in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"<header>{header}</header><nav>{nav}</nav><main>{body}</main>"
            f"<footer>{footer}</footer></body></html>\n")
