"""A member without the model file: how fast its share arrives, against a plain copy.

    .venv/bin/python benchmarks/ring_transfer.py [--model synthetic:smollm2-135m@q8_0]
        [--first 0] [--last N] [-r 3]

One `strata ring serve` daemon serves the GGUF (its --models directory holds a copy); this
process fetches layers [first, last) from it through strata.ring.control.transfer.fetch
(manifest, per-tensor SHA-256 on both sides, the handshake per tensor, a sparse copy) into
a fresh directory each repetition. The reference is the same bytes over one plain loopback
TCP connection with sendfile and no hashing (`plain`): the ratio is what the per-tensor
protocol and the hashes cost. Figures: bytes, seconds, MB/s per repetition (best of -r),
and the ratio fetch / plain. Loopback: the network's own speed is not in these figures.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STRATA = [sys.executable, "-m", "strata.cli"]


def plain_copy(path: Path, nbytes: int) -> float:
    """Seconds to move `nbytes` of `path` over one loopback connection (sendfile, recv)."""
    server = socket.create_server(("127.0.0.1", 0))

    def send() -> None:
        conn, _ = server.accept()
        with conn, path.open("rb") as f:
            conn.sendfile(f, 0, nbytes)

    threading.Thread(target=send, daemon=True).start()
    t0 = time.perf_counter()
    with socket.create_connection(server.getsockname()) as c, \
            tempfile.TemporaryFile() as out:
        left = nbytes
        while left:
            block = c.recv(min(1 << 20, left))
            if not block:
                break
            out.write(block)
            left -= len(block)
    server.close()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="synthetic:smollm2-135m@q8_0")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--last", type=int, default=None)
    ap.add_argument("-r", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("STRATA_RING_SECRET", secrets.token_hex(16))
    from strata.models.source import resolve
    from strata.ring.control import wire
    from strata.ring.control.transfer import fetch

    work = Path(tempfile.mkdtemp(prefix="strata-transfer-"))
    served = work / "served"
    served.mkdir()
    src = resolve(args.model)
    model = Path(shutil.copy(src.path("gguf", "ring"), served / "model.gguf"))
    last = args.last or src.spec.n_layers
    port = socket.create_server(("127.0.0.1", 0)).getsockname()[1]
    daemon = subprocess.Popen([*STRATA, "ring", "serve", "--name", "src", "--port", str(port),
                               "--host", "127.0.0.1", "--no-mdns", "--models", str(served)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "STRATA_HOME": str(work / "home")})
    try:
        for _ in range(600):
            try:
                wire.request("127.0.0.1", port, {"op": "status"}, timeout_s=2)
                break
            except wire.PeerError:
                time.sleep(0.1)
        fetched, plain = [], []
        for rep in range(args.r):
            got = fetch(("127.0.0.1", port), "model.gguf", args.first, last,
                        work / f"cache{rep}")
            fetched.append(got)
            plain.append(plain_copy(model, got.bytes))
            shutil.rmtree(work / f"cache{rep}")
        best = min(fetched, key=lambda g: g.seconds)
        p = min(plain)
        print(f"model {args.model}: layers [{args.first}, {last}) = {best.tensors} tensors, "
              f"{best.bytes / 1e6:.1f} MB")
        for i, (g, t) in enumerate(zip(fetched, plain, strict=True)):
            print(f"  rep {i}: fetch {g.seconds:.3f} s ({g.bytes / g.seconds / 1e6:.0f} MB/s)"
                  f"   plain sendfile {t:.3f} s ({g.bytes / t / 1e6:.0f} MB/s)")
        print(f"best: fetch {best.bytes / best.seconds / 1e6:.0f} MB/s, plain "
              f"{best.bytes / p / 1e6:.0f} MB/s, ratio fetch/plain "
              f"{(best.bytes / best.seconds) / (best.bytes / p):.2f} (first fetch includes "
              "the source's hashing)")
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
