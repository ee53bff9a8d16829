"""The kernel inside a model's reply: the fenced code block that defines the entry symbol.

A reply is untrusted text of any size (prose, several blocks, an HTML error page, a reply
cut off at the token limit, a megabyte of junk). Extraction is linear in its length and
never guesses: the block must *define* the entry (a call or a prototype does not count),
and a declaration line that names another op, dialect or entry is refused rather than
corrected, since the model then wrote a kernel for something else. A missing declaration
is added, with the requested op, dialect and entry (docs/kernels-abi.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from strata.kernels.dialects import get_dialect
from strata.kernels.impl import DECLARATION, HEADER_LINES

MAX_CODE_CHARS = 64 * 1024  # a kernel longer than this is junk or a runaway reply
FENCE = re.compile(r"^[ \t]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)")
HTML = re.compile(r"^\s*(?:<!doctype html|<html)", re.I)


@dataclass
class Extracted:
    code: str | None  # the kernel source, declaration first; None when refused
    problem: str = ""  # "" when usable, else one line saying why not (fed back to the model)
    blocks: int = 0  # fenced blocks in the reply
    defining: int = 0  # of them, blocks that define the entry (the first one is taken)
    declaration_added: bool = False

    @property
    def ok(self) -> bool:
        return self.code is not None


@dataclass
class _Block:
    info: str
    text: str
    closed: bool


def default_entry(op: str, dialect: str) -> str:
    """The function a kernel of `dialect` defines for `op` unless it declares another."""
    return get_dialect(dialect).default_entry(op)


def comment_prefix(dialect: str) -> str:
    return "#" if ".py" in get_dialect(dialect).suffixes else "//"


def fenced_blocks(reply: str) -> list[_Block]:
    """Markdown fenced blocks in order; an unclosed last block runs to the end (a reply cut
    off by the token limit)."""
    blocks: list[_Block] = []
    lines = reply.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, body = m.group("fence"), []
        i += 1
        while i < len(lines) and not _closes(lines[i], fence):
            body.append(lines[i])
            i += 1
        blocks.append(_Block(m.group("info").lower(), "\n".join(body) + "\n", i < len(lines)))
        i += 1
    return blocks


def _closes(line: str, fence: str) -> bool:
    s = line.strip()
    return len(s) >= len(fence) and set(s) == {fence[0]}


def defines(code: str, entry: str, dialect: str) -> bool:
    """True when `code` defines `entry`: a Python `def`, or a C/CUDA function body (a
    parameter list followed by `{`, not a call or a prototype ending in `;`)."""
    name = re.escape(entry)
    if comment_prefix(dialect) == "#":
        return re.search(rf"^\s*def\s+{name}\s*\(", code, re.M) is not None
    # a body, or a symbol the linker defines for it (an ifunc or alias: still the entry,
    # and the link check must get to refuse it)
    return re.search(rf"\b{name}\s*\([^;{{}}]*\)\s*(?:\{{|__attribute__\s*\(\(\s*"
                     rf"(?:ifunc|alias)\b)", code) is not None


def _declared(code: str) -> dict[str, str] | None:
    for line in code.splitlines()[:HEADER_LINES]:
        m = DECLARATION.search(line)
        if m:
            pairs = [p.split("=", 1) for p in m.group("body").split() if "=" in p]
            return {k.strip().lower(): v.strip() for k, v in pairs}
    return None


def _declaration_problem(decl: dict[str, str], op: str, dialect: str, entry: str) -> str:
    asked = {"op": op, "dialect": dialect, "entry": entry}
    got = {"op": decl.get("op", ""), "dialect": decl.get("dialect", ""),
           "entry": decl.get("entry", default_entry(op, dialect))}
    wrong = [f"{k}={got[k] or '(missing)'} (asked for {k}={asked[k]})"
             for k in asked if got[k] != asked[k]]
    return "the strata-kernel declaration says " + ", ".join(wrong) if wrong else ""


def _why_nothing(reply: str, blocks: list[_Block], entry: str) -> str:
    if not reply.strip():
        return "the reply is empty"
    if HTML.match(reply):
        return "the reply is an HTML page, not a chat answer (an error page from a proxy?)"
    if not blocks:
        return "no fenced code block (```) in the reply"
    if any(not b.closed for b in blocks):
        return (f"no code block defines {entry}; the last block is not closed (the reply "
                "was cut off?)")
    return f"no code block defines {entry} ({len(blocks)} block(s) in the reply)"


def extract_code(reply: str, op: str, dialect: str, entry: str | None = None) -> Extracted:
    """The first fenced block that defines `entry`, with its declaration checked or added."""
    entry = entry or default_entry(op, dialect)
    blocks = fenced_blocks(reply)
    # an oversized block is never searched: junk must cost no more than reading it once
    found = [b for b in blocks if len(b.text) <= MAX_CODE_CHARS and
             defines(b.text, entry, dialect)]
    if not found:
        big = max((len(b.text) for b in blocks), default=0)
        why = (f"the code block is {big:,} characters (at most {MAX_CODE_CHARS:,}); write "
               "one kernel, not a library") if big > MAX_CODE_CHARS else \
            _why_nothing(reply, blocks, entry)
        return Extracted(None, why, len(blocks))
    code = found[0].text
    out = Extracted(None, "", len(blocks), len(found))
    decl = _declared(code)
    if decl is not None:
        out.problem = _declaration_problem(decl, op, dialect, entry)
        out.code = None if out.problem else code
        return out
    line = f"{comment_prefix(dialect)} strata-kernel: op={op} dialect={dialect} entry={entry}"
    out.code, out.declaration_added = f"{line}\n{code}", True
    return out
