"""Who may talk to a ring member: the ring secret on every connection, models only from
--models, the default listening address. Real daemons on loopback, real sockets; each
attack is made as a stranger would make it, and each must be refused with no work started
and nothing read."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from strata.ring.control import auth, wire
from tests.conftest import RING_SECRET
from tests.test_ring_control import MODEL, PROMPT, STRATA, Ring, free_port, one_line_error, wait_for


@pytest.fixture
def ring(tmp_path: Path) -> Any:
    r = Ring(tmp_path)
    try:
        yield r
    finally:
        r.stop()


def _raw(port: int) -> tuple[socket.socket, Any, dict[str, Any]]:
    """A plain TCP connection to a daemon and the challenge it opens with."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    reader = sock.makefile("rb")
    return sock, reader, json.loads(reader.readline())


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendall((json.dumps(msg) + "\n").encode())


def _epoch(ring: Ring, name: str) -> int:
    return int(ring.status(name)["epoch"])


def test_first_start_makes_a_secret_that_only_its_holders_can_use(tmp_path: Path) -> None:
    """No secret anywhere: serve generates $STRATA_HOME/ring.secret (mode 600) and prints it
    once; a client of the same home uses it; a client without it, or with another, is
    refused in one line, and the daemon logs each refusal in one line."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != auth.ENV}
    ring = Ring(home.parent)
    ring.home = home
    home.mkdir()
    ring.env = {**env, "STRATA_HOME": str(home), "STRATA_PROGRESS": "0"}
    try:
        ring.start("a", wait=False)
        secret_file = home / auth.FILE_NAME
        wait_for(lambda: "ring node a on" in ring.log("a"), 60, "a never started")
        key = secret_file.read_text().strip()
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600 and len(key) == 64
        assert f"generated {secret_file}" in ring.log("a") and key in ring.log("a")
        res = ring.cli("ring", "status", "--connect", ring.addr("a"), "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["self"]["id"] == "a", res.stderr
        # another machine's CLI: no secret at all, then a wrong one
        elsewhere = {**env, "STRATA_HOME": str(tmp_path / "elsewhere")}
        res = subprocess.run([*STRATA, "ring", "status", "--connect", ring.addr("a")],
                             capture_output=True, text=True, env=elsewhere, timeout=60)
        line = one_line_error(res)
        assert "no ring secret here" in line and auth.ENV in line, line
        res = subprocess.run([*STRATA, "ring", "status", "--connect", ring.addr("a")],
                             capture_output=True, text=True, timeout=60,
                             env={**elsewhere, auth.ENV: "not-the-secret"})
        line = one_line_error(res)
        assert "wrong ring secret" in line, line
        wait_for(lambda: "wrong ring secret" in ring.log("a"), 5, "refusal not logged")
        refusals = [x for x in ring.log("a").splitlines() if x.startswith("refused ")]
        assert refusals and all("not-the-secret" not in x for x in refusals)
        # --secret-file with the right one works from anywhere
        copy = tmp_path / "copied.secret"
        shutil.copy(secret_file, copy)
        res = subprocess.run([*STRATA, "ring", "status", "--connect", ring.addr("a"),
                              "--secret-file", str(copy)],
                             capture_output=True, text=True, env=elsewhere, timeout=60)
        assert res.returncode == 0 and "a" in res.stdout, res.stderr
        # a restart reads the file and does not print it again
        ring.stop()
        ring.procs.clear()
        ring.start("a", wait=False)
        wait_for(lambda: "ring node a on" in ring.log("a"), 60, "no restart")  # a new log
        assert "generated" not in ring.log("a") and secret_file.read_text().strip() == key
    finally:
        ring.stop()


def test_strangers_replays_and_other_rings_start_no_work(ring: Ring) -> None:
    ring.start("a")
    before = _epoch(ring, "a")
    hints = ring.status("a")["hints"]  # alone, multicast off: the one ring-wide cause
    assert hints == ["no peer found and mDNS is off (--no-mdns): give --peers HOST:PORT of "
                     "one member"], hints
    # 1. a request without the handshake: refused, the request never read
    sock, reader, challenge = _raw(ring.ports["a"])
    assert challenge["op"] == "challenge" and len(challenge["nonce"]) == 2 * auth.NONCE_BYTES
    _send(sock, {"op": "run", "model": MODEL, "prompt": PROMPT, "n": 4})
    reply = json.loads(reader.readline())
    assert not reply["ok"] and "no ring-secret proof" in reply["error"], reply
    assert reader.readline() == b""  # and the connection is closed
    sock.close()
    # 2. a proof captured from a good handshake, replayed on a new connection
    sock, reader, challenge = _raw(ring.ports["a"])
    mine = auth.nonce()
    good = {"op": "auth", "nonce": mine,
            "mac": auth.mac(RING_SECRET.encode(), auth.CLIENT, challenge["nonce"], mine)}
    _send(sock, good)
    assert json.loads(reader.readline())["ok"]
    sock.close()
    sock, reader, _fresh = _raw(ring.ports["a"])
    _send(sock, good)
    reply = json.loads(reader.readline())
    assert not reply["ok"] and "wrong ring secret (or a replayed handshake)" in reply["error"]
    _send(sock, {"op": "run", "model": MODEL, "prompt": PROMPT, "n": 4})
    assert reader.readline() == b""
    sock.close()
    # 3. a daemon that only pretends (does not know the secret) is not believed by a client
    fake = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_impostor, args=(fake,), daemon=True).start()
    with pytest.raises(wire.Refused, match="without proving the ring secret"):
        wire.request("127.0.0.1", fake.getsockname()[1], {"op": "status"})
    fake.close()
    # 4. a daemon of another ring: the two refuse each other, neither joins
    ring.env = {**ring.env, auth.ENV: "another-ring"}
    ring.start("b", "--peers", ring.addr("a"), wait=False)  # our requests cannot reach it
    wait_for(lambda: "ring node b on" in ring.log("b"), 60, "b never started")

    def b_view() -> Any:  # asked with b's own secret (ring.env's now)
        res = ring.cli("ring", "status", "--connect", ring.addr("b"), "--json")
        peers = json.loads(res.stdout)["peers"] if res.returncode == 0 else []
        return next((p for p in peers if p["state"] == "refused"), None)
    peer = wait_for(b_view, 20, "b did not see a refuse it")
    assert "wrong ring secret" in peer["reason"], peer
    assert peer["fix"].startswith("it holds another ring secret: give every member the same"), \
        peer
    assert ring.live("a") == set()
    assert _epoch(ring, "a") == before
    assert ring.log("a").count("refused 127.0.0.1:") >= 3


def _impostor(server: socket.socket) -> None:
    """Speaks the protocol's first lines but answers the client's proof with a guess."""
    conn, _ = server.accept()
    conn.sendall(b'{"op":"challenge","protocol":2,"nonce":"00"}\n')
    conn.makefile("rb").readline()
    conn.sendall(b'{"ok":true,"mac":"0000"}\n')
    time.sleep(1)
    conn.close()


def test_models_outside_the_served_directories_are_never_opened(ring: Ring,
                                                                 tmp_path: Path) -> None:
    """--models DIR: a file in it runs by its name; an absolute path elsewhere, a `..`
    escape, a symbolic link out of DIR, a URL and /etc/passwd are refused before anything
    is opened — a FIFO outside DIR would block the daemon on open(), and it does not."""
    from strata.models.source import resolve

    served = tmp_path / "models"
    served.mkdir()
    shutil.copy(resolve(MODEL).path("gguf", "ring"), served / "deep.gguf")
    outside = tmp_path / "secret"
    outside.mkdir()
    trap = outside / "trap.gguf"
    os.mkfifo(trap)
    (served / "link.gguf").symlink_to(trap)
    ring.start("a", "--models", str(served))
    ok = ring.cli("ring", "run", "deep.gguf", "-p", PROMPT, "-n", "4", "--connect",
                  ring.addr("a"), "--json")
    assert ok.returncode == 0, (ok.stderr, ring.log("a"))
    ref = ring.cli("ring", "run", MODEL, "-p", PROMPT, "-n", "4", "--connect", ring.addr("a"),
                   "--json")
    assert json.loads(ok.stdout)["tokens"] == json.loads(ref.stdout)["tokens"]
    epoch = _epoch(ring, "a")
    for name in (str(trap), "../secret/trap.gguf", "link.gguf", "../../../../etc/passwd",
                 "/etc/passwd", "http://127.0.0.1:1/v1", "ollama:llama3"):
        line = one_line_error(ring.cli("ring", "run", name, "-p", PROMPT, "-n", "2",
                                       "--connect", ring.addr("a"), "--timeout", "10"))
        assert "not served here" in line or "serves files under its --models" in line, line
    for op in ({"op": "time_layer", "model": "../secret/trap.gguf"},
               {"op": "assign", "model": str(trap), "epoch": 99, "rank": 1},
               {"op": "bench", "args": [str(trap), "-p", "8", "-n", "none"]}):
        with pytest.raises(wire.Refused, match="not served here"):
            wire.request("127.0.0.1", ring.ports["a"], op, timeout_s=10)
    assert _epoch(ring, "a") == epoch  # no order was taken, no group formed
    assert not ring.procs["a"].poll()


def test_by_default_the_daemon_listens_on_its_advertised_address_and_loopback(
        ring: Ring) -> None:
    """No --host: the control port is on the address mDNS advertises and on 127.0.0.1 (the
    local CLI), never on every interface."""
    from strata.ring.control.discovery import _primary_address

    port, api = free_port(), free_port()
    log = (ring.home / "d.log").open("wb")
    ring.procs["d"] = subprocess.Popen([*STRATA, "ring", "serve", "--name", "d", "--port",
                                        str(port), "--no-mdns", "--api", str(api)],
                                       stdout=log, stderr=subprocess.STDOUT, env=ring.env)
    ring.ports["d"] = port
    ring.ready("d")
    wait_for(lambda: ring.log("d").count("api: ") == 2, 30, "no API on both addresses")
    conns = psutil.Process(ring.procs["d"].pid).net_connections()
    for p in (port, api):  # the control port, and the API's the same way
        listening = {c.laddr.ip for c in conns
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == p}
        assert listening == {"127.0.0.1", _primary_address()}, (p, listening)


def test_a_data_link_without_the_secret_is_refused() -> None:
    """The data plane: two ranks of one epoch whose secrets differ never form their links
    (each end proves the secret over the other's nonce); with the same secret they do."""
    from strata.ring.runtime.transport import PeerLost, form_group

    def pair(keys: tuple[bytes, bytes], epoch: int) -> list[Any]:
        port, out = free_port(), [None, None]

        def rank(r: int) -> None:
            try:
                out[r] = form_group("127.0.0.1", port, r, 2, epoch, 5.0, key=keys[r])
            except (PeerLost, OSError) as exc:
                out[r] = exc
        threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return out

    good = pair((b"k", b"k"), 1)
    assert all(not isinstance(g, Exception) for g in good), good
    for g in good:
        g.close()
    bad = pair((b"k", b"other"), 2)
    assert all(isinstance(b, Exception) for b in bad), bad
    assert any("did not prove the ring secret" in str(b) or "ring links" in str(b)
               for b in bad), bad
