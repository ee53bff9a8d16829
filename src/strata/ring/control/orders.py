"""What the leader and the members share to reach each other: where each live member is
reached, how an order is sent to it, and the model hash every order carries.

Its own module so that the leader (strata.ring.control.leader), the member side
(strata.ring.control.runner) and the layer timer (strata.ring.control.layer_time) import it
rather than each other: the runner calls the leader, never the other way round.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from strata.ring.control import wire
from strata.ring.control.wire import Message

SAMPLE = 1 << 16  # bytes per sampled chunk of a model file
SAMPLES = 64


def model_hash(model_ref: str) -> str:
    """A short id of the model's weights as this node would load them: the GGUF's size and
    64 chunks spread over it (a full hash of a 40 GB file would take a minute on every
    run; two different files that agree on all of these are not a realistic accident)."""
    from strata.models.source import resolve

    path = Path(resolve(model_ref).path("gguf", "ring"))
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        for i in range(SAMPLES):
            f.seek(max(0, size - SAMPLE) * i // (SAMPLES - 1))
            h.update(f.read(SAMPLE))
    return h.hexdigest()[:16]


def send_order(addr: tuple[str, int], msg: Message, timeout_s: float,
               on_progress: wire.Progress | None = None) -> Message:
    """An order to a member; a member that cannot be reached is a PeerError."""
    return wire.request(*addr, msg, timeout_s=timeout_s, connect_timeout_s=timeout_s,
                        on_progress=on_progress)


def reach_of(node: Any) -> dict[str, tuple[str, int]]:
    """Where this node's control links reach each live member (itself on loopback when it
    listens everywhere)."""
    own = "127.0.0.1" if node.config.host in ("", "0.0.0.0") else node.config.host
    return {node.member.id: (own, node.config.port),
            **{p.id: p.addr for p in node.live() if p.id}}
