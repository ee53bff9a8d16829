"""GGUF models on the kernel lab's own kernels (`-B lab`, docs/architecture.md §7).

    import strata.lab
    model = strata.lab.load("model.gguf", device="cpu")
    logits = model.prefill([bos, *prompt])      # [1, vocab] of the last token
    logits = model.decode(next_token)           # [1, vocab]

Weights stay as stored in the GGUF (`lab/weights.py`), the forward pass is lab ops chosen
per device by dispatch (`lab/kernels.py`, `lab/model.py`), torch is glue only and what it
computes is counted (`lab/accounting.py`). `strata fit MODEL -B lab` plans which kernel
would serve each op on a device (`lab/plan.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from strata.lab.model import LabModel

DEFAULT_CTX = 4096


def load(path: str | Path, device: str = "cpu", n_ctx: int = DEFAULT_CTX,
         threads: int | None = None, db: Path | None = None,
         say: Callable[[str], None] = lambda _m: None, kv: str = "f32") -> LabModel:
    """A GGUF ready to prefill/decode on `device`, with an empty KV cache of `n_ctx`
    positions whose elements are `kv` (f32; f16: half the bytes, llama.cpp's default; q8_0:
    GGUF q8_0 blocks, 34 bytes per 32 values)."""
    import torch

    from strata.backends.torch_device import resolve_device
    from strata.engine.kvcache import kv_type
    from strata.engine.ops_lab import LabOps
    from strata.hardware.threads import set_threads
    from strata.lab.model import LabModel
    from strata.lab.weights import read_weights
    from strata.paths import default_db_path
    from strata.store import open_db

    cache = kv_type(kv)
    dev: torch.device = resolve_device(device)
    used = set_threads(threads)
    weights = read_weights(Path(path), dev)
    cache.check(weights.spec.head_dim)  # before the ops are verified and built
    ops = LabOps.for_weights(weights, dev, say, open_db(db or default_db_path()), kv=kv)
    model = LabModel.build(weights, ops, dev, threads=used, kv_dtype=cache.dtype)
    model.reset(n_ctx)
    return model


__all__ = ["DEFAULT_CTX", "load"]
