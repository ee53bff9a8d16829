"""Commands that only read (hosts, history, compare, fit, report) leave no trace: without a
database they create no file or folder and say there is none; with one they change no byte
of it (opened read-only). `report` writes its HTML file, where --out says, and nothing else.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.seed_host import seed_host

MODEL = "synthetic:tiny@q8_0"

# (arguments, exit code without a database)
READERS = [
    (("hosts",), 0),
    (("history",), 2),
    (("compare", "1", "2"), 2),
    (("fit", MODEL), 0),
]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root`: size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("args,code", READERS, ids=[a[0] for a, _ in READERS])
def test_without_a_database_nothing_is_created(tmp_path: Path, args: tuple[str, ...],
                                               code: int) -> None:
    home = tmp_path / "home"  # does not exist
    proc = run_cli(*args, home=home)
    assert proc.returncode == code, proc.stderr
    assert not home.exists(), sorted(p.name for p in home.rglob("*"))
    if args[0] != "fit":  # fit plans from the model's metadata alone: no DB needed
        assert "no database at" in proc.stderr and "nothing was created" in proc.stderr


def test_report_and_db_flag_create_nothing(tmp_path: Path) -> None:
    home, out = tmp_path / "home", tmp_path / "r.html"
    proc = run_cli("report", "--out", str(out), home=home)
    assert proc.returncode == 2 and "no results yet: no database at" in proc.stderr
    assert not home.exists() and not out.exists()
    db = tmp_path / "missing" / "dir" / "strata.db"
    listed = run_cli("hosts", "-o", "json", "--db", str(db), home=home)
    assert listed.returncode == 0 and listed.stdout.strip() == "[]"
    assert not (tmp_path / "missing").exists() and not home.exists()


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("readonly-home")
    seed_host(home)  # this host and a roofline, no bench results
    return home


@pytest.mark.parametrize("args", [("hosts",), ("history",), ("fit", MODEL, "-o", "json"),
                                  ("report", "--out", "{out}")], ids=lambda a: a[0])
def test_an_existing_database_is_not_written(seeded: Path, tmp_path: Path,
                                             args: tuple[str, ...]) -> None:
    before = _tree(seeded)
    args = tuple(a.format(out=tmp_path / "r.html") for a in args)
    proc = run_cli(*args, home=seeded)
    assert proc.returncode in (0, 2), proc.stderr  # history: no results yet (exit 2)
    assert _tree(seeded) == before  # not a byte, not a -wal/-shm file, not a folder
    if args[0] == "fit":
        assert '"fingerprint"' in proc.stdout  # the host was probed, and not stored
