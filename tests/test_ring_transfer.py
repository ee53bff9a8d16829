"""A member without the model file: it receives its share's tensors from the leader, hashed
per tensor, cached in its STRATA_HOME, resumed after an interruption, refused when a hash
differs. Real daemons on loopback, real sockets, the real GGUF reader on the sparse copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from strata.errors import InputError
from strata.ring.control import wire
from strata.ring.control.transfer import fetch
from tests.test_ring_control import CAP, MODEL, PROMPT, Ring, wait_for


@pytest.fixture
def ring(tmp_path: Path) -> Any:
    r = Ring(tmp_path)
    try:
        yield r
    finally:
        r.stop()


def _gguf(tmp_path: Path) -> Path:
    from strata.models.source import resolve

    served = tmp_path / "served"
    served.mkdir()
    return Path(shutil.copy(resolve(MODEL).path("gguf", "ring"), served / "deep.gguf"))


def _tensor_bytes(path: Path, names: set[str]) -> dict[str, bytes]:
    import gguf

    return {t.name: bytes(t.data.tobytes()) for t in gguf.GGUFReader(path).tensors
            if t.name in names}


def test_a_member_without_the_file_fetches_its_share_and_runs_it(ring: Ring,
                                                                 tmp_path: Path) -> None:
    model = _gguf(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    ring.start("a", "--mem-cap", CAP, "--models", str(model.parent), wait=False)
    ring.start("b", "--mem-cap", CAP, "--models", str(empty), "--peers", ring.addr("a"),
               wait=False)
    ring.ready("a", "b")
    wait_for(lambda: ring.live("a") == {"b"}, 10, "b never joined")

    def run(name: str) -> dict[str, Any]:
        res = ring.cli("ring", "run", name, "-p", PROMPT, "-n", "8", "--connect",
                       ring.addr("a"), "--json", timeout=120)
        assert res.returncode == 0, (res.stderr, ring.log("a"), ring.log("b"))
        return json.loads(res.stdout)

    reference = run(MODEL)  # both members generate the preset themselves
    assert reference["world"] == 2 and reference["transfers"] == []
    first = run("deep.gguf")  # b has no deep.gguf: it fetches its layers from a
    assert first["tokens"] == reference["tokens"] and first["world"] == 2
    [moved] = first["transfers"]
    assert moved["member"] == "b" and moved["tensors"] > 0 and moved["bytes"] > 0, moved
    assert "fetched" in ring.log("b") and "MB/s" in ring.log("b")
    [cached] = (ring.home / "ring" / "models").glob("*/deep.gguf")  # b's STRATA_HOME
    assert cached.stat().st_size == model.stat().st_size  # the source's layout, sparse
    second = run("deep.gguf")  # held already: nothing moves again
    assert second["tokens"] == reference["tokens"] and second["transfers"] == []


def test_an_interrupted_transfer_resumes_and_a_changed_tensor_is_refused(
        ring: Ring, tmp_path: Path) -> None:
    model = _gguf(tmp_path)
    ring.start("a", "--models", str(model.parent))
    source = ("127.0.0.1", ring.ports["a"])
    root = tmp_path / "cache"
    manifest = wire.request(*source, {"op": "manifest", "model": "deep.gguf", "first": 0,
                                      "last": 2}, timeout_s=30)
    names = {t["name"] for t in manifest["tensors"]}
    assert "token_embd.weight" in names and not any(n.startswith("blk.2.") for n in names)
    with pytest.raises(InputError, match="interrupted after 3 tensors"):
        fetch(source, "deep.gguf", 0, 2, root, stop_after=3)
    [copy] = root.glob("*/deep.gguf")
    journal = json.loads(copy.with_name("deep.gguf.verified.json").read_text())
    assert len(journal) == 3
    rest = fetch(source, "deep.gguf", 0, 2, root)
    assert rest.tensors == len(names) - 3 and rest.path == copy
    assert _tensor_bytes(copy, names) == _tensor_bytes(model, names)  # byte for byte
    again = fetch(source, "deep.gguf", 0, 2, root)
    assert again.tensors == 0  # all verified: nothing asked

    # The source's file changes after its manifest: the tensor that differs is refused.
    target = next(t for t in manifest["tensors"] if t["name"] == "blk.1.attn_q.weight")
    with model.open("r+b") as f:
        f.seek(target["offset"] + 7)
        byte = f.read(1)
        f.seek(target["offset"] + 7)
        f.write(bytes([byte[0] ^ 0xFF]))
    fresh = tmp_path / "fresh"
    with pytest.raises(InputError, match=r"blk\.1\.attn_q\.weight .* does not match its "
                                         r"hash; refused"):
        fetch(source, "deep.gguf", 0, 2, fresh, manifest=manifest)
    [bad] = fresh.glob("*/deep.gguf")
    kept = json.loads(bad.with_name("deep.gguf.verified.json").read_text())
    assert "blk.1.attn_q.weight" not in kept
    # A name outside the source's --models is refused by the source, nothing sent.
    with pytest.raises(wire.Refused, match="not served here"):
        wire.request(*source, {"op": "send_bytes", "model": "../../../etc/passwd",
                               "ranges": [[0, 10]]})
