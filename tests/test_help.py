"""`--help` of every command and sub-command, as a user sees it in an 80-column terminal.

All pages render in this process (typer's CliRunner, COLUMNS=80): the same text rich lays
out for a terminal 80 cells wide, without a subprocess per command.

What a page must be:
- `-h` prints the same page as `--help`, everywhere (sub-apps included);
- every command (groups excluded) has an Examples block, each example on one line;
- no line is wider than 80 cells, and no word is cut ("http://127.0.0.1:8080/v…");
- prose is wrapped by rich, not by the docstring's line breaks: within a paragraph a line
  ends only where the next word would not have fitted (an "orphan" is the stub a source
  line break leaves: "…OpenMP only;" / "no constructors" at 80 columns);
- in an option/argument/command table, a wrapped help cell never ends in a line of a
  single word ("Independent" / "conversations.");
- an option spelled the same way shows the same metavar in every command (-o FORMAT,
  --max-time SECONDS, ...), and no usage line shows a doubled bracket ("[[OP]]").
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from rich.cells import cell_len
from typer.testing import CliRunner

from strata.cli import app

WIDTH = 80
TEXT_WIDTH = WIDTH - 2  # rich pads the page by one cell on each side
ROOT = typer.main.get_command(app)

# The same option name may carry different metavars only where its value is a different
# kind of thing (and the metavar says so).
METAVAR_EXCEPTIONS = {
    "--out": "train's is a run folder (DIR), report's an HTML file (FILE)",
    "--export": "train's is a flag (--export/--no-export), kernels attempts' a FILE",
    "--threads": "bench sweeps a list (-t 1-2,4), train takes one count",
    "-t": "bench sweeps a list of thread counts (llama-bench's -t), ring serve takes one",
    "-p": "bench's is prompt sizes (llama-bench's -p), ring run's the prompt text (llama-cli's)",
    "-n": "bench's is generation sizes (llama-bench's -n), ring run's one count (llama-cli's)",
    "--models": "ring serve's is a directory of model files (DIR), kernels eval's a list of "
                "language models (MODELS)",
}
ANNOTATION = re.compile(r"^\[(default|required|env var)[^\]]*\]$")


def _walk(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        if not sub.hidden:
            yield from _walk(sub, (*path, name))


COMMANDS = dict(_walk(ROOT))
IDS = [" ".join(p) or "strata" for p in COMMANDS]


def _render(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args, prog_name="strata", terminal_width=WIDTH,
                                env={"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)})
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def pages() -> dict[tuple[str, ...], str]:
    rendered = {}
    for path in COMMANDS:
        code, text = _render([*path, "--help"])
        assert code == 0, (path, text)
        rendered[path] = text
    return rendered


def _is_group(path: tuple[str, ...]) -> bool:
    return hasattr(COMMANDS[path], "commands")


def _prose(page: str) -> list[list[str]]:
    """Paragraphs of the text above the first panel; Usage, Examples and laid-out blocks
    (a paragraph whose later lines are indented: a definition list) excluded."""
    head = page.split("╭", 1)[0]
    paragraphs, current = [], []
    for line in [*head.splitlines(), ""]:
        if line.strip():
            current.append(line.rstrip())
        elif current:
            paragraphs.append(current)
            current = []

    def indent(line: str) -> int:
        return len(line) - len(line.lstrip())

    return [[line.strip() for line in p] for p in paragraphs
            if not p[0].strip().startswith(("Usage:", "Examples"))
            and not any(indent(line) > indent(p[0]) for line in p[1:])]


def _panels(page: str) -> Iterator[tuple[str, list[str]]]:
    """(title, inner lines) of each boxed panel (Arguments, Options, Commands, ...)."""
    title, rows = None, []
    for line in page.splitlines():
        if line.startswith("╭"):
            title, rows = line.strip("╭─╮ "), []
        elif line.startswith("╰") and title is not None:
            yield title, rows
            title = None
        elif title is not None and line.startswith("│"):
            rows.append(line[1:-1])


def _cells(rows: list[str]) -> Iterator[list[str]]:
    """The help cell of each table row, line by line. A continuation line is blank up to
    the help column; the help column starts where those lines' text starts."""
    starts = [len(r) - len(r.lstrip()) for r in rows if r.strip() and not r[:12].strip()]
    if not starts:
        return
    col = min(starts)
    cell: list[str] = []
    for r in rows:
        if r[:col].strip():  # the first line of a row
            if cell:
                yield cell
            cell = [r[col:].strip()]
        elif r.strip():
            cell.append(r[col:].strip())
    if cell:
        yield cell


def test_pages_are_80_columns(pages: dict[tuple[str, ...], str]) -> None:
    """The layout is rich's at exactly 80 cells (the panels span the page), no wider."""
    too_wide = [(" ".join(p), line) for p, page in pages.items()
                for line in page.splitlines() if cell_len(line) > WIDTH]
    assert not too_wide
    assert all(max(cell_len(line) for line in page.splitlines()) == WIDTH
               for page in pages.values())


@pytest.mark.parametrize("path", list(COMMANDS), ids=IDS)
def test_dash_h_is_help(path: tuple[str, ...], pages: dict[tuple[str, ...], str]) -> None:
    code, text = _render([*path, "-h"])
    assert code == 0 and text == pages[path]


def test_every_command_has_examples(pages: dict[tuple[str, ...], str]) -> None:
    missing, broken = [], []
    for path, page in pages.items():
        if _is_group(path):
            continue
        lines = page.split("╭", 1)[0].splitlines()
        at = [i for i, line in enumerate(lines) if line.strip() == "Examples"]
        if not at:
            missing.append(" ".join(path))
            continue
        block = []
        for line in lines[at[0] + 1:]:
            if not line.strip():
                break
            block.append(line)
        # each example indented under the heading and on one line (a wrapped one would
        # continue at the page margin)
        if not block or not all(line.startswith("   ") and line.strip().startswith(
                ("strata", "torchrun", "python")) for line in block):
            broken.append((" ".join(path), block))
    assert not missing, f"no Examples: {missing}"
    assert not broken, f"examples cut or not indented: {broken}"


def test_prose_has_no_orphan_lines(pages: dict[tuple[str, ...], str]) -> None:
    orphans = []
    for path, page in pages.items():
        for paragraph in _prose(page):
            for line, nxt in itertools.pairwise(paragraph):
                if len(line) + 1 + len(nxt.split()[0]) <= TEXT_WIDTH:
                    orphans.append((" ".join(path) or "strata", line, nxt))
    assert not orphans, "a line break inside a paragraph (the next word fitted):\n" + \
        "\n".join(f"  {p}: {a!r} / {b!r}" for p, a, b in orphans)


def test_table_cells_have_no_orphan_words(pages: dict[tuple[str, ...], str]) -> None:
    orphans = []
    for path, page in pages.items():
        for title, rows in _panels(page):
            for cell in _cells(rows):
                text = [line for line in cell if not ANNOTATION.match(line)]
                if len(text) >= 2 and len(text[-1].split()) == 1:
                    orphans.append((" ".join(path) or "strata", title, text[-2:]))
    assert not orphans, "help cells ending in a one-word line:\n" + \
        "\n".join(f"  {p} [{t}]: {c}" for p, t, c in orphans)


def _help_words(cmd: Any) -> set[str]:
    texts = [cmd.help or "", *(getattr(p, "help", "") or "" for p in cmd.params),
             *(c.help or "" for c in getattr(cmd, "commands", {}).values())]
    return {w for t in texts for w in t.split()}


def test_no_word_is_cut(pages: dict[tuple[str, ...], str]) -> None:
    """rich crops a word longer than its column with '…': the rest of it is lost."""
    cut = []
    for path, page in pages.items():
        words = _help_words(COMMANDS[path])
        for word in re.findall(r"\S+…", page):
            if not any(word in w for w in words):
                cut.append((" ".join(path), word))
    assert not cut, f"words cut by the column width: {cut}"


def test_usage_lines_have_single_brackets(pages: dict[tuple[str, ...], str]) -> None:
    doubled = [(" ".join(p), line.strip()) for p, page in pages.items()
               for line in page.splitlines()
               if line.strip().startswith("Usage:") and ("[[" in line or "{[" in line)]
    assert not doubled, "metavar='[X]' on an optional argument: typer adds the brackets"


def test_same_option_same_metavar() -> None:
    seen: dict[str, set[tuple[str, str]]] = defaultdict(set)
    ctx = ROOT.make_context("strata", [], resilient_parsing=True)
    for path, cmd in COMMANDS.items():
        for param in cmd.params:
            if param.param_type_name != "option" or param.is_flag:
                continue
            for opt in param.opts:
                seen[opt].add((param.display_type_rich(ctx=ctx) or "", " ".join(path)))
    mixed = {opt: sorted(uses) for opt, uses in seen.items()
             if len({m for m, _ in uses}) > 1 and opt not in METAVAR_EXCEPTIONS}
    assert not mixed, "one option, several metavars:\n" + "\n".join(
        f"  {opt}: {uses}" for opt, uses in sorted(mixed.items()))


def test_every_data_command_takes_o_and_json() -> None:
    """One output option everywhere: a command with -o/--format also takes --json (its
    alias), and a command with --json also takes -o."""
    uneven = []
    for path, cmd in COMMANDS.items():
        opts = {o for p in getattr(cmd, "params", []) for o in getattr(p, "opts", [])}
        if ("--format" in opts) != ("--json" in opts) or ("--format" in opts) != ("-o" in opts):
            uneven.append(" ".join(path))
    assert not uneven, f"-o and --json not both offered: {uneven}"


def test_placeholders_say_what_to_type(pages: dict[tuple[str, ...], str]) -> None:
    """No Python type in help (`<str>`, `<bool>`, `<list[str]>`), nothing after a flag, and
    a required argument as `MODEL` in the usage line (not typer's `{MODEL}`)."""
    typed = [(" ".join(p), m) for p, page in pages.items()
             for m in re.findall(r"<(?:str|int|float|bool|path|list\[[a-z]+\])>", page)]
    assert not typed, f"type placeholders: {typed}"
    braces = [(" ".join(p), line.strip()) for p, page in pages.items()
              for line in page.splitlines()
              if line.strip().startswith("Usage:") and re.search(r"\{[A-Z]", line)]
    assert not braces, f"typer's {{ARG}} in usage lines: {braces}"
    fit = pages[("fit",)]
    assert re.search(r"Usage: strata fit \[OPTIONS\] MODEL\b", fit)
    assert re.search(r"--swa-full +llama", fit)  # a flag: no value column
    assert re.search(r"-p +N\[,N\.\.\.\]", pages[("bench",)])
