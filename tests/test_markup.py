"""Text the user typed prints as typed: never rich markup, never an emoji.

Names with markup-like and emoji-like parts go through the real CLI (subprocess, stdout a
pipe) into error messages, table cells and titles; each must come back verbatim, and "[/]"
(a closing tag with nothing open) must not crash the printer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.seed_host import seeded_home
from tests.test_tables import printed_tables, seed_runs

HOSTILE = "[bold]x[/bold]:zzz:[/]"  # markup, an emoji code, and a tag closing nothing


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seeded_home(tmp_path_factory, "markup")


def _one_line_error(proc: object) -> str:
    err = proc.stderr.strip()  # type: ignore[attr-defined]
    assert proc.returncode == 2, err  # type: ignore[attr-defined]
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args", [
    ("compare", "commit:zzz", "1"),
    ("compare", f"commit:{HOSTILE}", "1"),
    ("bench", f"synthetic:{HOSTILE}"),
    ("fit", f"synthetic:{HOSTILE}"),
    ("quality", f"{HOSTILE}.gguf"),
])
def test_errors_quote_user_text_verbatim(home: Path, args: tuple[str, ...]) -> None:
    err = _one_line_error(run_cli(*args, home=home))
    typed = next(a for a in args if ":" in a and a != "1")
    assert typed.split(":", 1)[1] in err, err  # "[bold]", ":zzz:" and "[/]" intact
    assert "\N{SLEEPING SYMBOL}" not in err


def test_table_cells_and_titles_keep_user_text(home: Path) -> None:
    a, b = (str(run) for run in seed_runs(home, HOSTILE))
    for args in (("compare", a, b), ("history",), ("history", HOSTILE)):
        proc = run_cli(*args, home=home)
        assert proc.returncode == 0, proc.stderr
        models = {row[0] if args[0] == "compare" else row[5]
                  for t in printed_tables(proc.stdout) for row in t.rows}
        assert models == {HOSTILE}, proc.stdout
        assert "\N{SLEEPING SYMBOL}" not in proc.stdout
    title = run_cli("compare", f"run:{a}", b, home=home).stdout.splitlines()[0]
    assert title.startswith(f"B = {b} vs A = run:{a}")


def test_report_path_with_brackets_prints_as_typed(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "[bold]r[/bold]:zzz:.html"  # its "/" makes a folder "[bold]r["
    out.parent.mkdir()  # report never creates one: the user's path names an existing folder
    proc = run_cli("report", "--out", str(out), home=home)
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout and out.is_file()
