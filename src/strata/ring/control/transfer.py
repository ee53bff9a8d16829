"""A member without the model file receives its layers' bytes from one that has it.

The member that plans (the leader) always has the file; an `assign` to a member that does
not names the leader as the source. The receiver asks for a manifest of the tensors its
share needs (`wanted`: its layers, the embedding on the first stage, norm and head on the
last) with each one's offset, size and SHA-256, and the GGUF's header; it writes the header
and then each tensor at its own offset of a sparse file of the source's size — the same
layout as the source, so the engine reads it like any GGUF — under
$STRATA_HOME/ring/models/<manifest id>/. Each tensor's bytes come over a connection of
their own (the control handshake, then raw bytes: `sendfile` on the source) and are hashed
on arrival: a tensor whose hash differs is refused and nothing is kept of it. Verified
tensors are listed in a journal next to the file, so an interrupted transfer resumes with
the tensors still missing, and a later share of the same model fetches only what it adds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.errors import InputError
from strata.ring.control import wire
from strata.ring.control.wire import Channel, Message

CHUNK = 1 << 20
SEND_TIMEOUT_S = 60.0  # a source silent this long mid-tensor is gone


@dataclass
class Fetched:
    path: Path
    tensors: int = 0  # fetched now (the journal's earlier ones not counted)
    bytes: int = 0
    seconds: float = 0.0

    @property
    def rate_Bps(self) -> float | None:
        return self.bytes / self.seconds if self.seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "tensors": self.tensors, "bytes": self.bytes,
                "seconds": round(self.seconds, 4), "rate_Bps": self.rate_Bps}


# -- the source's side ----------------------------------------------------------------------

@dataclass
class Source:
    """A member's answers to `manifest` and `send_bytes` for the models it serves."""

    node: Any  # strata.ring.control.node.Node
    hashes: dict[tuple[str, float, str], str] = field(default_factory=dict)

    def handlers(self) -> dict[str, wire.Handler]:
        return {"manifest": self.manifest, "send_bytes": self.send_bytes}

    def manifest(self, msg: Message, chan: Channel) -> Message:
        path = Path(self.node.model_ref(str(msg["model"])))
        if not path.is_file() or path.suffix != ".gguf":
            raise InputError(f"{msg['model']}: only a single GGUF file can be sent to a member")
        first, last = int(msg["first"]), int(msg["last"])
        header, tensors = _layout(path, first, last)
        mtime = path.stat().st_mtime
        for t in tensors:
            key = (str(path), mtime, t["name"])
            if key not in self.hashes:
                self.hashes[key] = _sha256(path, t["offset"], t["nbytes"])
            t["sha256"] = self.hashes[key]
        return {"size": path.stat().st_size, "header": base64.b64encode(header).decode(),
                "tensors": tensors}

    def send_bytes(self, msg: Message, chan: Channel) -> Message:
        """The model's bytes at each of `ranges` ([offset, nbytes] pairs), back to back on
        this connection after the reply (the receiver counts them; nothing frames them)."""
        path = Path(self.node.model_ref(str(msg["model"])))
        size = path.stat().st_size
        ranges = [(int(o), int(n)) for o, n in msg["ranges"]]
        for offset, nbytes in ranges:
            if offset < 0 or nbytes < 0 or offset + nbytes > size:
                raise InputError(f"bytes [{offset}, {offset + nbytes}) are not in "
                                 f"{msg['model']}")

        def stream(sock: socket.socket) -> None:
            sock.settimeout(SEND_TIMEOUT_S)
            with path.open("rb") as f:
                for offset, nbytes in ranges:
                    sock.sendfile(f, offset, nbytes)
        return {wire.THEN: stream}


def _layout(path: Path, first: int, last: int) -> tuple[bytes, list[dict[str, Any]]]:
    """The GGUF's header (everything before the tensor data) and the tensors a share of
    layers [first, last) needs, with their absolute offsets and sizes."""
    import gguf

    from strata.engine.weights import wanted

    reader = gguf.GGUFReader(path)
    arch = str(reader.get_field("general.architecture").contents())
    n_layers = int(reader.get_field(f"{arch}.block_count").contents())
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    if not 0 <= first < last <= n_layers:
        raise InputError(f"layers [{first}, {last}) are not in the model's {n_layers}")
    with path.open("rb") as f:
        header = f.read(reader.data_offset)
    return header, [{"name": t.name, "offset": int(t.data_offset), "nbytes": int(t.n_bytes)}
                    for t in reader.tensors if wanted(t.name, first, last, n_layers, tied)]


def _sha256(path: Path, offset: int, nbytes: int) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        f.seek(offset)
        left = nbytes
        while left:
            block = f.read(min(CHUNK, left))
            if not block:
                raise InputError(f"{path} ends inside a tensor (truncated?)")
            h.update(block)
            left -= len(block)
    return h.hexdigest()


# -- the receiver's side --------------------------------------------------------------------

def fetch(source: tuple[str, int], model: str, first: int, last: int, root: Path,
          manifest: Message | None = None, stop_after: int | None = None) -> Fetched:
    """The tensors of layers [first, last) of `model` from the member at `source`, into a
    sparse copy under `root`; resumes from its journal. `stop_after` (tests): give up after
    that many tensors, as an interrupted transfer would."""
    manifest = manifest or wire.request(*source, {"op": "manifest", "model": model,
                                                  "first": first, "last": last},
                                        timeout_s=SEND_TIMEOUT_S)
    header = base64.b64decode(manifest["header"])
    ident = hashlib.sha256(header + str(manifest["size"]).encode()).hexdigest()[:16]
    path = root / ident / Path(model).name
    journal = path.with_name(path.name + ".verified.json")
    done = set(json.loads(journal.read_text())) if journal.is_file() else set()
    _prepare(path, header, int(manifest["size"]))
    out = Fetched(path)
    todo = [t for t in manifest["tensors"] if t["name"] not in done]
    t0 = time.perf_counter()
    if todo:
        _receive(source, model, path, todo[:stop_after], done, journal, out)
    out.seconds = time.perf_counter() - t0
    if stop_after is not None and len(todo) > stop_after:
        raise InputError(f"transfer of {model} interrupted after {out.tensors} tensors")
    return out


def _prepare(path: Path, header: bytes, size: int) -> None:
    """The sparse file: the header written, the rest a hole of the source's size (no disk
    blocks until a tensor lands in it)."""
    if path.is_file() and path.stat().st_size == size:
        with path.open("rb") as f:
            if f.read(len(header)) == header:
                return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(header)
        f.truncate(size)
    stale = path.with_name(path.name + ".verified.json")
    stale.unlink(missing_ok=True)


def _receive(source: tuple[str, int], model: str, path: Path, tensors: list[dict[str, Any]],
             done: set[str], journal: Path, out: Fetched) -> None:
    """`tensors` in order over one connection, each verified and journaled as it lands."""
    chan = wire.connect(*source, SEND_TIMEOUT_S)
    fd = os.open(path, os.O_WRONLY)
    name = tensors[0]["name"]
    try:
        wire.call(chan, {"op": "send_bytes", "model": model,
                         "ranges": [[t["offset"], t["nbytes"]] for t in tensors]},
                  SEND_TIMEOUT_S)
        for t in tensors:
            name = t["name"]
            digest = _land(chan, fd, int(t["offset"]), int(t["nbytes"]))
            _verify(path, model, source, t, digest)
            done.add(name)
            tmp = journal.with_name(journal.name + ".tmp")
            tmp.write_text(json.dumps(sorted(done)))
            tmp.replace(journal)  # the journal never lists a tensor that is not all there
            out.tensors += 1
            out.bytes += int(t["nbytes"])
    except (OSError, TimeoutError) as exc:
        raise InputError(f"transfer of {name} from {source[0]}:{source[1]} broke off "
                         f"({exc}); run again to resume") from None
    finally:
        os.close(fd)
        chan.close()


def _land(chan: Channel, fd: int, offset: int, nbytes: int) -> str:
    """One tensor's bytes from the connection into the file at `offset`; its SHA-256."""
    h = hashlib.sha256()
    got = 0
    while got < nbytes:
        block = chan.read_some(min(CHUNK, nbytes - got), SEND_TIMEOUT_S)
        if not block:
            raise ConnectionResetError("the source closed the connection mid-tensor")
        os.pwrite(fd, block, offset + got)
        h.update(block)
        got += len(block)
    return h.hexdigest()


def _verify(path: Path, model: str, source: tuple[str, int], t: dict[str, Any],
            digest: str) -> None:
    offset, nbytes = int(t["offset"]), int(t["nbytes"])
    if digest != t["sha256"]:
        with open(path, "r+b") as f:  # nothing is kept of a tensor that does not verify
            f.seek(offset)
            f.write(bytes(nbytes))
        raise InputError(f"{model}: tensor {t['name']} from {source[0]}:{source[1]} does not "
                         "match its hash; refused (the source's file changed, or the "
                         "transfer was corrupted)")

