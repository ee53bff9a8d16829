"""The channel between the judge and a kernel's worker process: one AF_UNIX SOCK_SEQPACKET
socket pair (made before the worker starts, so its seccomp filter, which denies socket(),
never matters), one JSON message per packet, shared-memory file descriptors passed along
with SCM_RIGHTS. Nothing the worker sends is a verdict: replies say "done" or name an
error, and the judge reads every result from shared memory itself."""

from __future__ import annotations

import json
import socket
from typing import Any

MAX_MESSAGE = 1 << 20
MAX_FDS = 64


class ChannelClosed(Exception):
    """The other side is gone (it exited, crashed or was killed)."""


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send(sock: socket.socket, msg: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    data = json.dumps(msg, separators=(",", ":")).encode()
    try:
        if fds:
            socket.send_fds(sock, [data], list(fds))
        else:
            sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise ChannelClosed(str(exc)) from None


def recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The next message and the descriptors that came with it; ChannelClosed at EOF.
    A timeout set on the socket raises TimeoutError."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    except (ConnectionResetError, BrokenPipeError) as exc:
        raise ChannelClosed(str(exc)) from None
    if not data:
        raise ChannelClosed("end of stream")
    try:
        msg = json.loads(data)
    except ValueError:
        msg = {"error": "unreadable message from the worker"}
    return (msg if isinstance(msg, dict) else {"error": "malformed message"}), fds
