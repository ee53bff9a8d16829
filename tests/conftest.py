"""Shared fixtures; `gpu` tests are skipped automatically where no GPU is usable."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
# The ring secret every test daemon and client shares (strata.ring.control.auth): set for
# the whole session, so each test's daemons, CLI calls and in-process requests prove it;
# the tests of the secret itself start daemons with another one, or without it.
RING_SECRET = "strata-test-ring-secret"
os.environ["STRATA_RING_SECRET"] = RING_SECRET


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    mps = getattr(torch.backends, "mps", None)
    return torch.cuda.is_available() or bool(mps and mps.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no GPU usable by torch on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def strata_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh STRATA_HOME so tests never touch the user's DB or cache."""
    home = tmp_path / "strata-home"
    monkeypatch.setenv("STRATA_HOME", str(home))
    return home


def run_cli(*args: str, home: Path, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `strata` CLI in a subprocess, as a user would."""
    env = {**os.environ, "STRATA_HOME": str(home), "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "strata.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def home_db(home: Path) -> sqlite3.Connection:
    """The results DB a CLI run wrote under STRATA_HOME, rows addressable by column name."""
    conn = sqlite3.connect(home / "strata.db")
    conn.row_factory = sqlite3.Row
    return conn


@pytest.fixture
def kernel_session(strata_home: Path):  # -> strata.commands.kernels.Session
    """Host caps, fingerprint and a fresh results DB for kernel-lab tests."""
    from strata.commands.kernels import session
    from strata.store import open_db

    strata_home.mkdir(parents=True, exist_ok=True)
    return session(conn=open_db(strata_home / "strata.db"))


def local_ring(workers: int = 3) -> Iterator[Any]:
    """Body of a module-scoped fixture: `workers` ring worker processes on loopback
    (strata.ring.runtime.local.LocalRing) for the whole module; afterwards none may be left."""
    import time

    import psutil

    from strata.ring.runtime.local import LocalRing

    ring = LocalRing(workers).start()
    try:
        yield ring
    finally:
        t0 = time.perf_counter()
        killed = ring.close()
        print(f"\nworkers closed in {time.perf_counter() - t0:.1f} s, killed: {killed}")
        assert not any(psutil.pid_exists(pid) for pid in ring.pids())


def ring_drive(ring: Any, path: Path, world: int, prompt: list[int], n_predict: int,
               ops: str = "lab") -> dict[str, Any]:
    """Generate `n_predict` tokens of the GGUF at `path` on `world` stages (even split) of a
    LocalRing with the `ops` backend; rank 0 drives, keeping every step's logits."""
    from strata.models.gguf import read_spec
    from strata.ring.runtime.assign import even_split
    from strata.ring.runtime.local import free_port

    n_layers = read_spec(path).n_layers
    common = {"port": free_port(), "world": world, "epoch": 1, "timeout_s": 30.0,
              "op_timeout_s": 30.0, "model": str(path), "ops": ops,
              "assignments": [(a.rank, a.first, a.last) for a in even_split(n_layers, world)]}
    for rank in range(1, world):
        ring.send(rank, op="serve", rank=rank, **common)
    ring.send(0, op="drive", **common, prompt=prompt, n_predict=n_predict, keep_logits=True)
    answer = ring.answer(0)
    ring.send(0, op="stop")
    assert ring.answer(0)["ok"]
    for rank in range(1, world):
        assert ring.answer(rank) == {"ok": True, "stopped": True}
    assert answer["ok"], answer
    return dict(answer["result"])


def verify_cases(op: str, seeds: int, external: bool = False) -> int:
    """Cases a passing verification runs, counted by hand from the op's spec: every verify
    shape at every seed, the serve shapes once (external kernels: what dispatch will call),
    and each clause's own cases (docs/kernels-abi.md, "Clauses")."""
    from strata.kernels.spec import get_spec

    spec = get_spec(op)
    serve = len(spec.shapes.get("serve", [])) if external else 0
    return seeds * len(spec.shapes["verify"]) + serve + len(spec.clause_cases())


def sandbox_verify_context(home: Path) -> Iterator[Any]:
    """A forcing VerifyContext on a fresh STRATA_HOME `home` (the variable restored after):
    the module fixture of the tests that verify built-in or wrong kernels in the sandbox."""
    from strata.kernels.service import session
    from strata.kernels.verify import VerifyContext
    from strata.store import open_db

    old = os.environ.get("STRATA_HOME")
    os.environ["STRATA_HOME"] = str(home)
    s = session(conn=open_db(home / "strata.db"))
    try:
        yield VerifyContext(s.conn, s.fingerprint, s.caps, force=True)
    finally:
        if old is None:
            os.environ.pop("STRATA_HOME", None)
        else:
            os.environ["STRATA_HOME"] = old


def run_sandboxed(ctx: Any, pendings: list[Any]) -> list[Any]:
    """Verdicts of planned verifications, run two at a time (each its own worker process)."""
    from concurrent.futures import ThreadPoolExecutor

    from strata.kernels.verify import finish, run_pending

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda p: run_pending(p, ctx.caps), pendings))
    return [finish(p, r, ctx) for p, r in zip(pendings, results, strict=True)]


def seeded_home(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A module's STRATA_HOME: a fresh folder with the recorded host seeded (no probe run),
    set in the environment for the module's tests."""
    from tests.seed_host import seed_host

    path = tmp_path_factory.mktemp(name)
    seed_host(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(path))
        yield path
