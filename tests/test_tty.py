"""The data commands on a real 80-column terminal (a pty, as tmux or a small window): no
figure is ever cut, every line fits, the main figures of the JSON appear whole on screen,
and the columns left out are named. (Piped output has its own test: test_tables.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.seed_host import seeded_home
from tests.tty import cut_figures, run_in_pty

TINY = "synthetic:tiny@q8_0"
MODEL = "synthetic:llama-3.1-8b@q4_k_m"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home that knows this host and a seeded roofline (no 30 s measurement)."""
    return seeded_home(tmp_path_factory, "tty")


def _screen(home: Path, *args: str, cols: int = 80) -> str:
    code, screen = run_in_pty(*args, home=home, cols=cols)
    assert code == 0, screen[-2000:]
    assert cut_figures(screen) == [], screen
    wide = [line for line in screen.splitlines() if len(line.rstrip()) > cols]
    assert not wide, wide
    return screen


def _json(home: Path, *args: str) -> object:
    proc = run_cli(*args, "-o", "json", home=home)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_bench_and_history_at_80_columns(home: Path) -> None:
    screen = _screen(home, "bench", TINY, "-B", "llamacpp", "-p", "16", "-n", "4", "-r", "2")
    assert "narrow terminal:" in screen  # what it left out is said, not cropped
    history = _json(home, "history")
    for rec in history:
        mean = f"{rec['avg_ts']:,.2f}"
        assert mean in screen, (mean, screen)  # the t/s figure, whole
    screen = _screen(home, "history")
    for rec in history:
        assert f"{rec['avg_ts']:,.2f} ± {rec['stddev_ts']:,.2f}" in screen
        assert rec["test"] in screen


def test_fit_and_whatif_at_80_columns(home: Path) -> None:
    screen = _screen(home, "fit", MODEL, "--on", "rtx-4090", "--on", "m3-max-40c:48")
    doc = _json(home, "fit", MODEL, "--on", "rtx-4090", "--on", "m3-max-40c:48")
    for dev in doc["devices"]:
        assert dev["device"] in screen
        total = f"{dev['total_bytes'] / 2**30:,.2f} GiB"
        assert total in screen
    screen = _screen(home, "whatif", MODEL, "--on", "rtx-4090", "--on", "rx-9070-xt",
                     "--on", "epyc-9654", "--price", "rtx-4090=1599")
    rows = _json(home, "whatif", MODEL, "--on", "rtx-4090", "--on", "rx-9070-xt", "--on",
                 "epyc-9654")["rows"]
    for r in rows:
        tg = r["predicted_decode_ts"]
        assert (f"{tg:,.0f}" if tg >= 100 else f"{tg:.1f}") in screen


def test_hosts_and_a_wide_terminal_keep_every_column(home: Path) -> None:
    screen = _screen(home, "hosts")
    fp = _json(home, "hosts")[0]["fingerprint"]
    assert fp in screen  # an id is never split over two lines
    wide = _screen(home, "history", cols=200)
    assert "narrow terminal" not in wide and "llama.cpp" in wide
