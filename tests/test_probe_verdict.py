"""`probe --no-smoke` (with or without --measure) keeps the support verdict an earlier smoke
test stored, instead of replacing it with "unknown: smoke test not run"."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console

from strata.commands.probe import run_probe
from strata.hardware.support import KEPT_SMOKE
from strata.store import open_db
from strata.store.hosts import load_host
from tests.conftest import run_cli
from tests.seed_host import SEEDED_ROOFLINE


def test_no_smoke_keeps_the_stored_smoke_verdict(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = run_cli("probe", "-o", "json", home=home)  # the real smoke test
    assert first.returncode == 0, first.stderr
    smoked = json.loads(first.stdout)["profile"]["verdicts"][0]
    assert smoked["device"] == "cpu" and smoked["smoke"]["ok"] is True

    # --measure --no-smoke; the roofline is a recorded one (measuring takes 10-30 s)
    conn = open_db(home / "strata.db")
    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115 (closed with the process)
    result = run_probe(conn, measure=True, smoke=False, smoke_timeout_s=90, console=quiet,
                       measurer=lambda _profile, _say: SEEDED_ROOFLINE)
    assert result.roofline_is_new and result.refused is None
    for verdict in (result.profile.verdicts[0], load_host(conn, result.fingerprint).verdicts[0]):
        assert verdict.status == smoked["status"] and verdict.smoke is not None
        assert verdict.smoke.ok and KEPT_SMOKE in verdict.reasons

    again = run_cli("probe", "--no-smoke", "-o", "jsonl", home=home)  # one record per device
    cpu = json.loads(again.stdout.splitlines()[0])
    assert (cpu["device"], cpu["support"], cpu["smoke_ok"]) == ("cpu", smoked["status"], True)
    assert cpu["bandwidth_gbs"] == SEEDED_ROOFLINE.devices[0].peak_bandwidth_gbs()
