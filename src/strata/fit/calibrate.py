"""What llama.cpp really allocates for a model, to check strata.fit.memory's rules against.

  python -m strata.fit.calibrate MODEL --ctx N [--kv-type f16] [--ubatch 512]

Loads MODEL with the bench backend (same context settings), prefills the whole context the
way bench does (logits for the last token only), and prints as JSON: the process RSS growth
from before the load to after the prefill, and the buffer sizes llama.cpp logged (model, KV,
compute, output). Run it in a fresh process: RSS is per process. Unlike `strata fit`, this
loads the weights — it is the measurement the fit rules are tested against.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

_BUFFER = re.compile(r"(\w+)\s+(model|KV|compute|output) buffer size =\s+([\d.]+) MiB")
MiB = 2**20


@contextlib.contextmanager
def _stderr_to(path: str) -> Iterator[None]:
    """llama.cpp logs through fd 2: capture it (Python's sys.stderr is not involved)."""
    saved = os.dup(2)
    with open(path, "wb") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def reported_buffers(log: str) -> dict[str, int]:
    """Bytes per buffer kind ("model", "KV", "compute", "output") summed over devices."""
    out: dict[str, int] = {}
    for _dev, kind, mib in _BUFFER.findall(log):
        out[kind] = out.get(kind, 0) + round(float(mib) * MiB)
    return out


def measure(ref: str, ctx: int, kv_type: str = "f16", ubatch: int = 512) -> dict[str, Any]:
    os.environ["STRATA_LLAMA_LOG"] = "1"  # the backend then echoes llama.cpp's log to fd 2
    import psutil

    from strata.backends.base import LoadConfig, RunRequest
    from strata.backends.llamacpp import LlamaCppBackend
    from strata.models.source import resolve

    model = resolve(ref)
    model.path("gguf", "llamacpp")  # materialise first: its writing is not the load's cost
    proc = psutil.Process()
    backend = LlamaCppBackend()
    fd, log_path = tempfile.mkstemp(suffix=".log")
    os.close(fd)
    try:
        before = proc.memory_info().rss
        with _stderr_to(log_path):
            backend.load(model, LoadConfig(n_ctx=ctx, kv_type=kv_type, kv_type_v=kv_type,
                                           ubatch=ubatch, flash_attn=kv_type != "f16"))
            bos = backend.bos()
            head = [bos] if bos is not None else []
            prompt = head + backend.random_tokens(ctx - 1 - len(head), seed=0)
            backend.run(RunRequest((), tuple(prompt), 1))  # the context, full
            after = proc.memory_info().rss
            backend.close()
        with open(log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
    finally:
        backend.close()  # idempotent: frees what a failed load or run left
        os.unlink(log_path)
    return {"ref": ref, "ctx": ctx, "kv_type": kv_type, "ubatch": ubatch,
            "rss_delta_bytes": after - before, "reported_bytes": reported_buffers(log)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m strata.fit.calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--kv-type", default="f16")
    p.add_argument("--ubatch", type=int, default=512)
    a = p.parse_args(argv)
    print(json.dumps(measure(a.model, a.ctx, a.kv_type, a.ubatch)))


if __name__ == "__main__":
    main()
