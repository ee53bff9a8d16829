"""Real servers on loopback for the openai backend's tests.

`llama_server` starts llama-cpp-python's OpenAI-compatible server as a subprocess (the real
thing, with a tiny GGUF). `fake_server` runs a small http.server in a thread for the failure
modes a real server does not produce on demand (dying mid-stream, never answering).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

import httpx

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    url: str  # base URL ending /v1
    _log: IO[bytes]

    def log(self) -> str:
        """Everything the server printed so far (llama-cpp-python is verbose by default)."""
        return _tail(self._log, limit=None)


@contextlib.contextmanager
def llama_server(model: Path, n_ctx: int = 512, ready_s: float = 60.0) -> Iterator[RunningServer]:
    """`python -m llama_cpp.server` on a free loopback port, ready to answer."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", HOST,
           "--port", str(port), "--n_ctx", str(n_ctx)]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://{HOST}:{port}/v1"
            _wait_ready(url, proc, log, ready_s)
            yield RunningServer(url, log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: IO[bytes], ready_s: float) -> None:
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited ({proc.returncode}): {_tail(log)}")
        try:
            if httpx.get(url + "/models", timeout=2.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"llama_cpp.server not ready within {ready_s:g} s: {_tail(log)}")


def _tail(log: IO[bytes], limit: int | None = 2000) -> str:
    log.flush()
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    log.seek(0, 2)  # the server keeps appending at the end
    return text if limit is None else text[-limit:]


# -- fake servers for failure modes ---------------------------------------------------------

MODELS_JSON = b'{"object":"list","data":[{"id":"fake","object":"model"}]}'


class FakeHandler(BaseHTTPRequestHandler):
    """Answers /v1/models like a server, 404 elsewhere; subclasses override completions."""

    protocol_version = "HTTP/1.1"
    release: threading.Event  # set by fake_server: lets sleeping handlers finish

    def log_message(self, *_args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, MODELS_JSON)
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        if self.path == "/v1/completions":
            self.completions()
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def completions(self) -> None:
        self._send(404, b'{"detail":"Not Found"}')

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def fake_server(handler: type[FakeHandler]) -> Iterator[str]:
    """Run `handler` on a free loopback port in a thread; yields the base URL (/v1)."""
    release = threading.Event()
    cls = type(handler.__name__, (handler,), {"release": release})
    server = ThreadingHTTPServer((HOST, 0), cls)
    server.daemon_threads = True
    server.block_on_close = False  # a handler still sleeping must not block teardown
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}/v1"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent_socket() -> Iterator[str]:
    """A port that accepts connections and never answers anything; yields the base URL."""
    sock = socket.socket()
    sock.bind((HOST, 0))
    sock.listen(8)  # the kernel completes handshakes from the backlog; nobody ever reads
    try:
        yield f"http://{HOST}:{sock.getsockname()[1]}/v1"
    finally:
        sock.close()
