"""Terminal view of `strata quality`: the figures table and the quantisation frontier line."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from strata.views.console import plain

Record = dict[str, Any]
FLOAT_LABELS = ("f32", "f16", "bf16")  # storage types both backends compute without rounding


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ppl(r: Record) -> str:
    return f"{r['ppl']:,.4f} ± {r['ppl_sd']:,.4f}"


def _ci(r: Record) -> str:
    ci = r["ppl_ci95"]
    return f"{ci[0]:,.3f} .. {ci[1]:,.3f}" if ci else "- (1 chunk)"


COLUMNS: list[tuple[str, str, Any]] = [  # header, justify, cell
    ("model", "left", lambda r: plain(r["model"])),
    ("backend", "left", lambda r: plain(r["backend"])),
    ("PPL ± (as llama.cpp)", "right", _ppl),
    ("95% CI (chunk means)", "right", _ci),
    ("ref PPL", "right", lambda r: _num(r["ref_ppl"], ",.4f")),
    ("ΔPPL", "right", lambda r: _num(r["delta_ppl"], "+,.4f")),
    ("KL mean", "right", lambda r: _num(r["kl"], ".6f")),
    ("KL p99", "right", lambda r: _num(r["kl_p99"], ".6f")),
    ("top-1", "right", lambda r: _num(r["top1"], ".2%")),
    ("tokens", "right", lambda r: f"{r['n_tokens']:,} in {r['n_chunks']}x{r['ctx']}"),
    ("s", "right", lambda r: f"{r['seconds']:.1f}"),
]


def quality_table(records: list[Record]) -> Table:
    refs = {r["ref"] for r in records if r["ref"]}
    title = "strata quality" + (f" · reference {', '.join(sorted(refs))}" if refs else "")
    t = Table(title=plain(title), title_justify="left")  # names the user typed: not markup
    for header, justify, _cell in COLUMNS:
        t.add_column(header, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in records:
        t.add_row(*(cell(r) for _h, _j, cell in COLUMNS))
    return t


def _speed(r: Record) -> str:
    s = r.get("speed")
    if not s:  # what to bench: the file itself where the name is a label (--quants)
        model = (r.get("info") or {}).get("model_file", r["model"])
        return f"decode speed unknown: run strata bench on both ({model}, {r['ref']})"
    ratio = s["ratio"]
    words = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    weak = f"; unreliable: {s['caveat']}" if s.get("caveat") else ""
    return f"{words} decode ({s['backend']} {s['test']}{weak})"


def frontier_line(r: Record) -> str:
    """e.g. "q4_0 vs f16 (llamacpp): 2.40x faster decode (llamacpp tg128), +0.0800 PPL
    (+1.2%), KL 0.020000, top-1 97.10%"."""
    me, ref = r["model_label"], r["ref_label"]
    name = f"{me} vs {ref}" if me != ref else f"{r['model']} vs {r['ref']}"
    rel = r["delta_ppl"] / r["ref_ppl"] if r["ref_ppl"] else 0.0
    return (f"{name} ({r['backend']}): {_speed(r)}, {r['delta_ppl']:+.4f} PPL ({rel:+.2%}), "
            f"KL {r['kl']:.6f}, top-1 {r['top1']:.2%}")


def notes(records: list[Record]) -> list[str]:
    """How the figures were made, once per distinct fact."""
    lines: list[str] = []
    for r in records:
        for line in (f"tokens: {r['tokenizer']}",
                     f"text: {r['text']['name']} ({r['text']['tokens']:,} tokens, sha256 "
                     f"{r['text']['sha256'][:12]})",
                     f"scoring: {r['scoring']}"):
            if line not in lines:
                lines.append(line)
    if any(r["ppl_ci95"] for r in records):
        lines.append("PPL ±: llama-perplexity's uncertainty, PPL x the SD of the token NLLs "
                     "÷ √tokens (tokens taken as independent); 95% CI: from the spread of the "
                     "chunks' mean NLL (tokens within a chunk are not independent), so it is "
                     "the wider and the one to read when comparing models")
    if len({r["backend"] for r in records}) > 1:
        ppl = [r["ppl"] for r in records]
        line = (f"backend agreement: PPL spread {max(ppl) - min(ppl):.6g} "
                f"({(max(ppl) - min(ppl)) / min(ppl):.2e} relative)")
        if records[0]["model_label"] not in FLOAT_LABELS:  # expected, not a bug: say why
            line += ("; same weights, but llama.cpp's quantised kernels also round the "
                     "activations (q8_0) while torch computes in float32")
        lines.append(line)
    return lines


# -o md: the table's figures, by their record field names (docs/output.md)
MD_FIELDS = ("model_filename", "backend", "ppl", "ppl_sd", "ref_ppl", "delta_ppl", "kl",
             "kl_p99", "top1", "n_tokens", "n_chunks", "n_ctx", "time_s")
