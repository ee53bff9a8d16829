"""Terminal table of a serving-load sweep (bench/load.py): one row per level.

One table per (model, backend, request shape); its title states the shape and the SLO that
goodput counts against. Latencies print as p50 / p90 / p99 in ms."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from strata.views.console import plain


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pcts(r: dict[str, Any], name: str) -> str:
    values = [r.get(f"{name}_{p}_ms") for p in ("p50", "p90", "p99")]
    return "-" if values[0] is None else " / ".join(_num(v, 0 if v >= 100 else 1)
                                                  for v in values if v is not None)


def _level(r: dict[str, Any]) -> str:
    if r.get("request_rate") is None:
        return f"c{r['concurrency']}"
    cap = f" c{r['concurrency']}" if r.get("concurrency") else ""
    return f"{r['request_rate']:g}/s{cap}"


def _goodput(r: dict[str, Any]) -> Text:
    share = r.get("goodput_share")
    if share is None:
        return Text("-", style="dim")
    style = "green" if share >= 0.99 else ("yellow" if share >= 0.5 else "red")
    return Text(f"{r['goodput_rps']:,.2f} ({share:.0%})", style=style)


def _groups(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        shape = f"pp{r['n_prompt']}+tg{r['n_gen']}"
        groups.setdefault((r["model_filename"], r["backend"], shape), []).append(r)
    return groups


def load_tables(records: list[dict[str, Any]], title: str = "strata bench") -> list[Table]:
    tables = []
    for (model, backend, shape), rows in _groups(records).items():
        slo = (f"SLO TTFT ≤ {rows[0]['slo_ttft_ms']:g} ms, ITL ≤ {rows[0]['slo_itl_ms']:g} ms")
        t = Table(title=f"{title} · {model} · {backend} · {shape}\n"
                        f"serving load; goodput = requests meeting {slo}",
                  title_justify="left")
        for col, just in (("level", "left"), ("req", "right"), ("out t/s", "right"),
                          ("req/s", "right"), ("TTFT ms p50/90/99", "right"),
                          ("ITL ms p50/90/99", "right"), ("E2E ms p50/99", "right"),
                          ("goodput req/s", "right"), ("streams", "right")):
            t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
        for r in rows:
            e2e = [r.get("e2e_p50_ms"), r.get("e2e_p99_ms")]
            t.add_row(plain(_level(r)), str(r["requests"]), _num(r["output_ts"]),
                      _num(r["requests_ps"], 2), _pcts(r, "ttft"), _pcts(r, "itl"),
                      " / ".join(_num(v, 0) for v in e2e) if e2e[0] is not None else "-",
                      _goodput(r), _streams(r))
        tables.append(t)
    return tables


def _streams(r: dict[str, Any]) -> str:
    """Requests the server streamed at once / requests in flight (fewer: queueing)."""
    k, m = r.get("server_parallel"), r.get("in_flight_max")
    return f"{k if k is not None else '-'}/{m if m is not None else '-'}"


MD_COLUMNS = ("model_filename", "backend", "test", "concurrency", "request_rate", "requests",
              "window_s", "output_ts", "requests_ps", "ttft_p50_ms", "ttft_p90_ms",
              "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "e2e_p50_ms",
              "e2e_p99_ms", "goodput_rps", "goodput_share", "in_flight_max", "server_parallel")


def load_md(records: list[dict[str, Any]]) -> str:
    """-o md of a load sweep: the level's figures (the SLO is in every record's csv/json)."""
    from strata.store.export import md_table

    numeric = tuple(c for c in MD_COLUMNS if c not in ("model_filename", "backend", "test"))
    return md_table(records, MD_COLUMNS, numeric)
