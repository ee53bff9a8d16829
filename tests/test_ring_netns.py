"""Ring members in separate network namespaces joined by veth pairs (tests/ring_netns.py):
real IP traffic between network stacks, and a link taken down mid-generation is a lost
member — the leader plans again and the replay gives the same text. Skipped, with the
reason, where this machine cannot make user and network namespaces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("ring_netns.py")


def _namespaces_unavailable() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs util-linux's unshare and iproute2's ip"
    probe = subprocess.run(["unshare", "-Urn", "ip", "link", "add", "v0", "type", "veth",
                            "peer", "name", "v1"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unprivileged user + network namespaces unavailable: {probe.stderr.strip()}"
    return None


def test_a_link_taken_down_mid_generation_is_a_lost_member(tmp_path: Path) -> None:
    why = _namespaces_unavailable()
    if why:
        pytest.skip(why)
    out = tmp_path / "out.json"
    root = str(Path(__file__).resolve().parents[1])
    res = subprocess.run(["unshare", "-Urn", sys.executable, str(SCRIPT), str(out),
                          str(tmp_path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": root})
    logs = {p.name: p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("*.log")}
    assert res.returncode == 0, (res.stderr[-3000:], logs)
    r = json.loads(out.read_text())
    assert sorted(r["hosts"].values()) == ["10.9.0.1", "10.9.0.2", "10.9.0.3"], r["hosts"]
    ref, dropped, victim = r["reference"], r["dropped"], r["victim"]
    assert dropped["victim_rx_bytes_before_drop"] > 0  # the activations crossed its veth
    assert len(set(ref["tokens"])) > 10  # sampled: a replay that diverged would show
    assert [e["lost"] for e in dropped["lost"]] == [victim], dropped["lost"]
    assert dropped["lost"][0]["at_token"] >= 10
    assert victim not in {s["member"] for s in dropped["stages"]}
    assert dropped["tokens"] == ref["tokens"] == ref["heard"]
    assert dropped["heard"] == dropped["tokens"]  # streamed once each, across the loss
