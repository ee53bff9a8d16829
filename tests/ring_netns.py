"""Three ring members, each in its own network namespace, joined by veth pairs on a bridge:
real IP traffic between separate network stacks, not loopback. Run as
`unshare -Urn python tests/ring_netns.py OUT.json HOME` (a user namespace whose root may
make network namespaces and links); tests/test_ring_netns.py does, and checks OUT.json.

Two sampled generations of the same request: the first with every link up (the reference),
the second with the veth of a stage's member taken down after 10 tokens: the second stage's
(the driver's wait for it runs past the request's op deadline), or the first stage's when the
second is the leader (the leader's wait for the driver does). The member is lost, the leader
plans again over the other two and the replay must give the reference's tokens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STRATA = [sys.executable, "-m", "strata.cli"]
NET = "10.9.0"
PORT = 7473
CAP = "0.0008"  # GiB: tiny-deep needs two members (tests.test_ring_control's CAP)
MODEL = "synthetic:tiny-deep@f32"
REQUEST = {"op": "run", "model": MODEL, "prompt": "The ring turns", "n": 60, "seed": 5,
           "temperature": 1.0, "stream": True, "op_timeout_s": 3.0}


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def member_ns(name: str, index: int) -> subprocess.Popen[bytes]:
    """A process holding a new network namespace, wired to the bridge as NET.index."""
    holder = subprocess.Popen(["unshare", "-n", "sleep", "600"])
    time.sleep(0.2)
    pid = str(holder.pid)
    sh("ip", "link", "add", f"v{name}", "type", "veth", "peer", "name", f"v{name}-in")
    sh("ip", "link", "set", f"v{name}", "master", "br0")
    sh("ip", "link", "set", f"v{name}", "up")
    sh("ip", "link", "set", f"v{name}-in", "netns", pid)
    for cmd in (["ip", "addr", "add", f"{NET}.{index}/24", "dev", f"v{name}-in"],
                ["ip", "link", "set", f"v{name}-in", "up"], ["ip", "link", "set", "lo", "up"]):
        sh("nsenter", "-t", pid, "-n", *cmd)
    return holder


def rx_bytes(link: str) -> int:
    """Bytes received on `link` in this network namespace (/proc/net is per namespace;
    /sys/class/net shows the host's)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == link:
            return int(rest.split()[0])
    raise RuntimeError(f"no link {link}")


def main(out: Path, home: Path) -> None:
    from strata.ring.control import wire

    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "br0", "type", "bridge")
    sh("ip", "link", "set", "br0", "up")
    sh("ip", "addr", "add", f"{NET}.254/24", "dev", "br0")
    env = {**os.environ, "STRATA_HOME": str(home), "STRATA_PROGRESS": "0"}
    holders, daemons = [], {}
    result: dict[str, Any] = {}
    try:
        for i, name in enumerate("abc", start=1):
            holders.append(member_ns(name, i))
            peers = [] if name == "a" else ["--peers", f"{NET}.1:{PORT}"]
            log = (home / f"{name}.log").open("wb")
            daemons[name] = subprocess.Popen(
                ["nsenter", "-t", str(holders[-1].pid), "-n", *STRATA, "ring", "serve",
                 "--name", name, "--host", f"{NET}.{i}", "--port", str(PORT), "--no-mdns",
                 "--timeout", "1.5", "--mem-cap", CAP, *peers],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                st = wire.request(f"{NET}.1", PORT, {"op": "status"}, timeout_s=2,
                                  connect_timeout_s=2)
                if {p["member"]["id"] for p in st["peers"] if p["state"] == "live"} >= {"b",
                                                                                       "c"}:
                    break
            except wire.PeerError:
                pass
            time.sleep(0.3)
        else:
            raise RuntimeError("the three members never formed a ring")
        result["hosts"] = {m["id"]: m["host"] for m in
                           [st["self"], *(p["member"] for p in st["peers"])]}
        heard: list[int] = []
        ref = wire.request(f"{NET}.1", PORT, REQUEST, timeout_s=60,
                           on_progress=lambda m: heard.append(m["token"]))
        result["reference"] = {"tokens": ref["tokens"], "stages": ref["stages"],
                               "heard": heard}
        # The second stage's member, unless that is the leader: the client's request goes
        # to the leader, and a leader cut off cannot answer it (then the victim is rank 0,
        # the driver, and the leader finds it silent past the op deadline)
        members = [s["member"] for s in ref["stages"]]
        victim = next(m for m in reversed(members) if m != st["leader"])
        result["victim"], result["leader"] = victim, st["leader"]
        rx0 = rx_bytes(f"v{victim}")
        dropped: list[float] = []

        def drop(msg: dict[str, Any]) -> None:
            if len(heard2) == 10 and not dropped:
                sh("ip", "link", "set", f"v{victim}", "down")
                dropped.append(time.monotonic())
            heard2.append(msg["token"])

        heard2: list[int] = []
        t0 = time.monotonic()
        again = wire.request(f"{NET}.1", PORT, REQUEST, timeout_s=60, on_progress=drop)
        result["dropped"] = {"tokens": again["tokens"], "stages": again["stages"],
                             "lost": again["lost"], "heard": heard2,
                             "seconds": time.monotonic() - t0,
                             "victim_rx_bytes_before_drop": rx0}
    finally:
        for proc in daemons.values():
            proc.send_signal(signal.SIGTERM)
        for proc in daemons.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        for h in holders:
            h.kill()
            h.wait()
        out.write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
