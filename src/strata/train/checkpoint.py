"""Checkpoints: everything a run needs to continue exactly where it stopped.

One file, `checkpoint.pt` in the run's folder, replaced atomically (a crash while writing
leaves the previous one). It holds the model and optimizer state, the step, the data
position, every random generator (torch, numpy, python; CUDA where used), the run's config
and its loss history, so a resumed run draws the same batches and computes the same losses
as one that never stopped. Only plain containers, numbers, strings and tensors go in, so it
loads with `torch.load(weights_only=True)`: opening a checkpoint never runs pickled code.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from strata.errors import InputError

FORMAT = 1
FILENAME = "checkpoint.pt"


@dataclass
class History:
    """The curves so far: train (step, loss, lr) and validation (step, loss, bits/byte)."""

    train: list[list[float]] = field(default_factory=list)
    val: list[list[float]] = field(default_factory=list)


@dataclass
class Checkpoint:
    step: int  # optimizer steps done
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    data: dict[str, Any]  # Batches.state()
    rng: dict[str, Any]
    config: dict[str, Any]  # TrainConfig.to_dict(): what the run was asked to do
    history: History
    tokens_seen: int
    elapsed_s: float  # training time so far (for tokens/s and ETA across a resume)
    run_id: int = 0  # the DB run that wrote it


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """Every generator a training step may draw from, as weights_only-loadable values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                  "has_gauss": has_gauss, "gauss": gauss},
        "python": {"version": version, "mt": list(mt), "gauss_next": gauss_next},
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device | None = None) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["mt"]), p["gauss_next"]))
    if device is not None and device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(folder: Path, ckpt: Checkpoint) -> Path:
    """Write `folder`/checkpoint.pt via a temporary file and an atomic rename."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILENAME
    tmp = folder / f".{FILENAME}.{os.getpid()}.tmp"
    payload = {**asdict(ckpt), "format": FORMAT}
    payload["model"], payload["optimizer"] = ckpt.model, ckpt.optimizer  # asdict deep-copies
    try:
        torch.save(payload, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint at `path` (a file, or a run folder holding checkpoint.pt)."""
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    if not path.is_file():
        raise InputError(f"--resume: no checkpoint at {path} (a run writes one every "
                         "ckpt_every steps and on Ctrl-C)")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged/foreign file
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise InputError(f"--resume: {path} is not a readable strata checkpoint ({first})") \
            from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise InputError(f"--resume: {path} is not a strata checkpoint of format {FORMAT}")
    raw.pop("format")
    raw["history"] = History(**raw["history"])
    return Checkpoint(**raw)
