"""A Llama-family GGUF's tensors as stored: q8_0/q4_0 blocks, f16, f32 — never dequantised.

Each 2-D weight becomes the tensor its lab op reads (docs/kernels-abi.md): F32 -> float32
[N,K], F16 -> float16 [N,K], Q8_0/Q4_0 -> uint8 [N, K/32·block bytes]; norms and biases are
float32. The bytes are read once into memory (bounds-checked by strata.models.gguf); the
only transformation is llama.cpp's Q/K row permutation, undone on whole rows (a row is a
run of blocks, so the encoding is untouched), because the lab's `rope` rotates half-split
pairs as transformers does (strata.models.gguf_torch explains the permutation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from strata.errors import InputError
from strata.models.gguf import Shard, scan_or_input_error, shards, spec_from_layout
from strata.models.gguf_torch import ARCHS, ROPE_FREQS, ArchRule, llama_config, unpermute_rows
from strata.models.spec import OUTPUT, ModelSpec

TOKEN_EMBD = "token_embd.weight"
# GGML storage type -> (torch dtype of the stored elements, values per row element group)
STORED_DTYPES: dict[str, torch.dtype] = {"F32": torch.float32, "F16": torch.float16,
                                         "Q8_0": torch.uint8, "Q4_0": torch.uint8}


@dataclass
class Stored:
    """One tensor as the lab's ops read it."""

    kind: str  # GGML type name: F32, F16, Q8_0, Q4_0
    data: torch.Tensor  # see the module docstring
    shape: tuple[int, ...]  # the logical (PyTorch-order) shape: (N, K) for a matrix

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


@dataclass
class LabWeights:
    path: Path
    spec: ModelSpec
    rule: ArchRule
    config: dict[str, Any]  # eps, rope theta/scaling, special ids (gguf_torch.llama_config)
    tensors: dict[str, Stored] = field(default_factory=dict)
    rope_freqs: np.ndarray | None = None

    def matrix(self, name: str) -> Stored:
        return self.tensors[name]

    def head(self) -> Stored:
        """The output head: output.weight, or token_embd tied to it (llama.cpp's rule)."""
        return self.tensors.get(OUTPUT) or self.tensors[TOKEN_EMBD]


def read_weights(path: Path, device: torch.device) -> LabWeights:
    """Every tensor of a Llama-family GGUF as stored, on `device`; InputError lines for
    architectures, storage types or files the lab cannot run."""
    layout, sizes = scan_or_input_error(path)
    arch = layout.kv.get("general.architecture")
    refuse_experts(path, arch, layout.kv)
    rule = ARCHS.get(arch) if isinstance(arch, str) else None
    if rule is None:
        raise InputError(f"MODEL {path}: -B lab runs the {', '.join(ARCHS)} architectures, "
                         f"not {arch}; use --backend llamacpp")
    files = shards(path, layout, sizes)
    spec = spec_from_layout(path, layout, [p for s in files
                                           for p in zip(s.layout.tensors, s.sizes, strict=True)])
    out = LabWeights(path, spec, rule, {})
    for shard in files:
        for i, t in enumerate(shard.layout.tensors):
            if t.name == ROPE_FREQS:
                out.rope_freqs = _read(path, shard, i).view(np.float32).copy()
                continue
            out.tensors[t.name] = _stored(path, shard, i, spec, rule, device)
    if TOKEN_EMBD not in out.tensors or len(out.tensors[TOKEN_EMBD].shape) != 2:
        raise InputError(f"MODEL {path}: no 2-D {TOKEN_EMBD} tensor")
    biases = any(n.endswith(".bias") for n in out.tensors)
    out.config = llama_config(path, spec, layout.kv, rule, out.tensors[TOKEN_EMBD].shape[0],
                              biases)
    return out


def refuse_experts(path: Path, arch: Any, kv: dict[str, Any]) -> None:
    """A mixture-of-experts GGUF ({arch}.expert_count > 0): the lab has no routed-expert
    op, so it says so in one line instead of failing on the 3-D expert tensors."""
    experts = kv.get(f"{arch}.expert_count")
    if isinstance(experts, int) and experts > 0:
        used = kv.get(f"{arch}.expert_used_count")
        raise InputError(f"MODEL {path}: a mixture-of-experts model ({experts} experts, {used} "
                         "per token): -B lab runs dense models only (no routed-expert op); "
                         "use --backend llamacpp")


def _stored(path: Path, shard: Shard, index: int, spec: ModelSpec, rule: ArchRule,
            device: torch.device) -> Stored:
    t = shard.layout.tensors[index]
    kind = _kind(t.type_id)
    if kind not in STORED_DTYPES:
        raise InputError(f"MODEL {path}: tensor {t.name!r} is stored as {kind}; the lab's "
                         f"ops read {', '.join(STORED_DTYPES)} (strata fit MODEL -B lab lists "
                         "the missing kernels); use --backend llamacpp")
    shape = tuple(reversed(t.ne))
    raw = _read(path, shard, index)
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    values = raw.view(_numpy_dtype(kind)).reshape(rows, -1) if len(shape) > 1 else \
        raw.view(_numpy_dtype(kind))
    if rule.permuted_qk and len(shape) == 2:
        values = _unpermute(t.name, values, spec)
    data = torch.from_numpy(np.ascontiguousarray(values))
    if len(shape) == 1:  # norms and biases: the float32 vectors the ops take
        data = data.float()
    return Stored(kind, data.to(device), shape)


def _unpermute(name: str, rows: np.ndarray, spec: ModelSpec) -> np.ndarray:
    if name.endswith("attn_q.weight"):
        return unpermute_rows(rows, spec.n_heads)
    if name.endswith("attn_k.weight"):
        return unpermute_rows(rows, spec.n_kv_heads)
    return rows


def _read(path: Path, shard: Shard, index: int) -> np.ndarray:
    """The stored bytes of one tensor in a writable array (torch wants to own writable
    memory), read straight into it: one copy of the file's bytes, no more."""
    t, size = shard.layout.tensors[index], shard.sizes[index]
    buf = np.empty(size.nbytes, dtype=np.uint8)
    try:
        with open(shard.path, "rb") as f:
            f.seek(shard.layout.data_offset + t.offset)
            got = f.readinto(memoryview(buf))
    except OSError as exc:
        raise InputError(f"MODEL {shard.path}: cannot read tensor {t.name!r}: "
                         f"{exc.strerror or exc}") from exc
    if got != size.nbytes:
        raise InputError(f"MODEL {shard.path}: tensor {t.name!r} ends past the end of the file "
                         "(it changed since it was opened, or is truncated)")
    return buf


def _kind(type_id: int) -> str:
    import gguf

    return gguf.GGMLQuantizationType(type_id).name


def _numpy_dtype(kind: str) -> Any:
    return {"F32": np.float32, "F16": np.float16}.get(kind, np.uint8)
