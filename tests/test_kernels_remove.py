"""`strata kernels remove` undoes `strata kernels add`; the kernel ABI document that `add`
points to ships inside the package. Through the real CLI, as a user runs it."""

from __future__ import annotations

import fnmatch
import re
from importlib.resources import files
from pathlib import Path

import pytest

from tests.conftest import home_db, run_cli

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
NAME = "c.ext.my_rmsnorm"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernels-remove")


def _listed(home: Path) -> list[str]:
    """The rmsnorm implementations `strata kernels list` shows (its registry, read here in
    process: a `kernels list` subprocess spends seconds probing the host)."""
    from strata.kernels.registry import implementations

    db = home_db(home)
    try:
        return [i.name for i in implementations("rmsnorm", db)]
    finally:
        db.close()


def test_remove_undoes_add(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "my_rmsnorm.c"
    src.write_text((FIXTURES / "kernels" / "rmsnorm_wrong_above_2048.c").read_text()
                   .replace("c < 2048 ? w[c] : 1.0f", "w[c]"))
    # `kernels add --no-bench` in process (strata.kernels.add: the same door, and the host
    # probe of this process is reused); the CLI's add is tested in test_kernels_cli.py
    import strata

    monkeypatch.setenv("STRATA_HOME", str(home))
    outcome = strata.kernels.add(src, db=home / "strata.db")
    assert outcome.registered and outcome.impl.name == NAME, outcome.verdict
    db = home_db(home)
    [(copy,)] = db.execute("SELECT path FROM kernel_impls WHERE name=?", (NAME,)).fetchall()
    assert Path(copy).is_file() and Path(copy) != src
    assert db.execute("SELECT COUNT(*) FROM kernel_results WHERE impl=?", (NAME,)).fetchone()[0]
    db.close()
    assert NAME in _listed(home)

    proc = run_cli("kernels", "remove", NAME, home=home)
    assert proc.returncode == 0, proc.stderr
    assert f"removed rmsnorm/{NAME}" in proc.stdout
    db = home_db(home)
    assert not db.execute("SELECT * FROM kernel_impls WHERE name=?", (NAME,)).fetchall()
    assert not db.execute("SELECT * FROM kernel_results WHERE impl=?", (NAME,)).fetchall()
    assert db.execute("SELECT COUNT(*) FROM kernel_results").fetchone()[0] == 0  # nothing else
    db.close()
    assert not Path(copy).exists()  # the private copy `add` wrote
    assert src.is_file()  # the user's own file stays
    listed = _listed(home)
    assert NAME not in listed and "c.naive" in listed

    again = run_cli("kernels", "remove", NAME, home=home)
    assert again.returncode == 2 and "no kernel added under this name" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1 and "Traceback" not in again.stderr


@pytest.mark.parametrize("name", ["c.naive", "rmsnorm/c.avx2", "torch.eager"])
def test_a_built_in_kernel_cannot_be_removed(home: Path, name: str) -> None:
    proc = run_cli("kernels", "remove", name, home=home)
    assert proc.returncode == 2, proc.stdout
    assert "built-in kernel" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_abi_document_ships_with_the_package() -> None:
    shipped = files("strata.kernels") / "ABI.md"
    assert shipped.is_file()
    # docs/kernels-abi.md is the same text (a copy for readers of the repository)
    assert shipped.read_text("utf-8") == (ROOT / "docs" / "kernels-abi.md").read_text("utf-8"), \
        "edit src/strata/kernels/ABI.md and copy it to docs/kernels-abi.md"
    # and the wheel takes it: a package-data pattern of pyproject.toml matches it
    block = re.search(r"\[tool\.setuptools\.package-data\]\s*strata\s*=\s*\[(.*?)\]",
                      (ROOT / "pyproject.toml").read_text(), re.S)
    assert block, "pyproject.toml has no package-data for strata"
    patterns = re.findall(r'"([^"]+)"', block.group(1))
    assert any(fnmatch.fnmatch("kernels/ABI.md", p) for p in patterns)


def test_add_and_abi_point_to_the_installed_document(home: Path, tmp_path: Path) -> None:
    shipped = Path(str(files("strata.kernels") / "ABI.md"))
    bare = tmp_path / "bare.c"
    bare.write_text("void f(void) {}\n")
    proc = run_cli("kernels", "add", str(bare), home=home)
    assert proc.returncode == 2 and "no 'strata-kernel:" in proc.stderr
    [named] = re.findall(r"(/\S+?ABI\.md)", proc.stderr)
    assert Path(named) == shipped and Path(named).is_file()

    where = run_cli("kernels", "abi", "--path", home=home)
    assert where.returncode == 0 and Path(where.stdout.strip()) == shipped
    text = run_cli("kernels", "abi", home=home)
    assert text.returncode == 0 and text.stdout == shipped.read_text("utf-8")
