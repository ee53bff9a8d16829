"""A layer range of a GGUF, read as stored: what the executor's ops start from.

Only the tensors of layers [first, last) are read (plus the token embedding on the first
range, the final norm and the head on the last one, token_embd again where the head is
tied), one at a time, through strata's bounds-checked GGUF reader: no process ever holds the
rest of the file. Each tensor keeps its stored encoding (`Stored`): F32 → float32 [N, K],
F16 → float16 [N, K], any block type (Q8_0, Q4_0, Q4_K, ...) → uint8 [N, bytes per row]
(a 3-D expert tensor [E, N, K] is E·N such rows); BF16 is widened to float32 and 1-D
tensors (norms, biases) are float32 — the ops read them that way. The one transformation
is llama.cpp's q/k row permutation, undone on whole rows (a row is a run of blocks, so the
encoding is untouched) for architectures whose RoPE is "normal" (strata.models.arch.spec).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from strata.errors import InputError
from strata.models import arch as arch_registry
from strata.models.arch.spec import ROPE_FREQS, ROPE_LONG, ROPE_SHORT, ROPE_TENSORS, Arch
from strata.models.gguf import Shard, scan_or_input_error, shards, spec_from_layout
from strata.models.gguf_torch import float_key, llama_config, rule_of, unpermute_rows
from strata.models.spec import OUTPUT, TOKEN_EMBD, ModelSpec, TensorInfo

OUTPUT_NORM = "output_norm.weight"
FLOAT_BYTES = 4
# stored types kept as floats of their own width (the rest are blocks of bytes)
_FLOATS = {"F32": np.float32, "F16": np.float16}


@dataclass
class Stored:
    """One tensor as stored: its GGML type, its data, its logical (PyTorch-order) shape."""

    kind: str  # GGML type name: F32, F16, Q8_0, Q4_K, ...
    data: torch.Tensor  # see the module docstring
    shape: tuple[int, ...]  # (N, K) for a matrix, (E, N, K) for merged experts

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def expert(self, e: int) -> Stored:
        """Expert `e`'s [N, K] matrix of a merged 3-D expert tensor (a view, no copy)."""
        n_exp, n = self.shape[0], self.shape[1]
        rows = self.data.view(n_exp, n, -1)[e]
        return Stored(self.kind, rows, self.shape[1:])


@dataclass
class ModelWeights:
    """What a layer range of one model needs: its spec, architecture, forward config (eps,
    RoPE theta/scaling, vocab) and tensors by GGUF name."""

    path: Path
    spec: ModelSpec
    arch: Arch
    config: dict[str, Any]
    first: int
    last: int
    tensors: dict[str, Stored] = field(default_factory=dict)
    rope_freqs: np.ndarray | None = None
    rope_factors: dict[str, np.ndarray] = field(default_factory=dict)  # LongRoPE long/short

    @property
    def moe(self) -> bool:
        return self.spec.is_moe

    @property
    def window(self) -> int:
        """Positions a sliding-window layer sees (the file's {arch}.attention.sliding_window,
        read with the spec), 0 where the architecture windows no layer."""
        return self.spec.sliding_window if self.arch.swa_pattern is not None else 0

    def windowed(self, layer: int) -> bool:
        return self.arch.windowed(layer, self.window)

    def frequency_factors(self, capacity: int) -> np.ndarray | None:
        """What divides the rotary frequencies of a `capacity`-position cache: Llama 3's
        rope_freqs, or Phi-3's LongRoPE factors as llama.cpp picks them (the long ones when
        the context exceeds the original one)."""
        if self.rope_factors:
            long = capacity > int(self.config.get("rope_original_ctx") or 0)
            return self.rope_factors.get(ROPE_LONG if long else ROPE_SHORT)
        return self.rope_freqs

    def head(self) -> Stored:
        """The output head: output.weight, or token_embd tied to it (llama.cpp's rule)."""
        return self.tensors.get(OUTPUT) or self.tensors[TOKEN_EMBD]


# -- which tensors a range holds, and their bytes -------------------------------------------


def wanted(name: str, first: int, last: int, n_layers: int, tied: bool) -> bool:
    """Does the range holding layers [first, last) need GGUF tensor `name`?"""
    if name.startswith("blk."):
        index = name.split(".", 2)[1]
        return index.isdigit() and first <= int(index) < last
    if name == TOKEN_EMBD:  # the lookup on the first range; the tied head on the last
        return first == 0 or (tied and last == n_layers)
    if name in (OUTPUT_NORM, OUTPUT):
        return last == n_layers
    return name in ROPE_TENSORS  # every range rotates its own queries and keys


def is_bias(name: str) -> bool:
    """A bias (1-D, or gpt-oss's per-expert [E, N]): float32 wherever it is held."""
    return name.endswith(".bias")


def held_bytes(t: TensorInfo, as_float: bool) -> int:
    """Bytes of tensor `t` once loaded: float32 for the torch ops (`as_float`), else as
    stored, except what the reader widens to float32 (1-D tensors, biases, BF16)."""
    if as_float or len(t.shape) < 2 or t.dtype == "BF16" or is_bias(t.name):
        return t.elements * FLOAT_BYTES
    return t.nbytes


def range_bytes(spec: ModelSpec, first: int, last: int, as_float: bool = False) -> int:
    """Weight bytes the range [first, last) holds, from the spec alone (nothing read)."""
    return sum(held_bytes(t, as_float) for t in spec.tensors
               if t.name not in ROPE_TENSORS
               and wanted(t.name, first, last, spec.n_layers, spec.tied_embeddings))


# -- reading --------------------------------------------------------------------------------


def read_range(path: Path, first: int | None, last: int | None, device: torch.device,
               where: str = "strata's engine", check: Callable[[ModelSpec], None] | None = None
               ) -> ModelWeights:
    """Layers [first, last) of the GGUF at `path` (None: from the first / to the last layer)
    as stored, on `device`; InputError lines for files the engine cannot run. `check` sees
    the spec before any tensor is read (a memory cap, a range check)."""
    layout, sizes = scan_or_input_error(path)
    arch = arch_registry.get(layout.kv.get("general.architecture"), where)
    files = shards(path, layout, sizes)
    spec = spec_from_layout(path, layout, [p for s in files
                                           for p in zip(s.layout.tensors, s.sizes, strict=True)])
    arch.check_experts(path, spec.is_moe)
    first = 0 if first is None else first
    last = spec.n_layers if last is None else last
    if not 0 <= first < last <= spec.n_layers:
        raise InputError(f"layers [{first}, {last}) are not a non-empty range of the "
                         f"model's {spec.n_layers} layers")
    if check is not None:
        check(spec)
    _check_layers(path, spec, arch, first, last)
    out = ModelWeights(path, spec, arch, {}, first, last)
    for shard in files:
        for i, t in enumerate(shard.layout.tensors):
            if not wanted(t.name, first, last, spec.n_layers, spec.tied_embeddings):
                continue
            if t.name == ROPE_FREQS:
                out.rope_freqs = _floats(path, shard, i).reshape(-1).copy()
                continue
            if t.name in (ROPE_LONG, ROPE_SHORT):
                out.rope_factors[t.name] = _floats(path, shard, i).reshape(-1).copy()
                continue
            out.tensors[t.name] = _stored(path, shard, i, spec, arch, device)
    vocab = next((x.shape[0] for x in spec.tensors if x.name == TOKEN_EMBD), 0)
    if vocab == 0:
        raise InputError(f"MODEL {path}: no 2-D {TOKEN_EMBD} tensor")
    if last == spec.n_layers and OUTPUT_NORM not in out.tensors:
        raise InputError(f"MODEL {path}: no {OUTPUT_NORM} tensor")
    biases = any(x.name.endswith(".bias") for x in spec.tensors)
    out.config = llama_config(path, spec, layout.kv, rule_of(arch), vocab, biases)
    out.config["expert_weights_norm"] = bool(
        layout.kv.get(f"{spec.arch}.expert_weights_norm", True))
    # Phi-3's LongRoPE: the context its short factors are for, and the cos/sin scale
    out.config["rope_original_ctx"] = layout.kv.get(
        f"{spec.arch}.rope.scaling.original_context_length")
    out.config["rope_attn_factor"] = float_key(layout.kv,
                                               f"{spec.arch}.rope.scaling.attn_factor", 1.0)
    return out


def _check_layers(path: Path, spec: ModelSpec, arch: Arch, first: int, last: int) -> None:
    by_layer: dict[int, list[str]] = {i: [] for i in range(first, last)}
    for x in spec.tensors:
        parts = x.name.split(".", 2)
        if parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) in by_layer:
            by_layer[int(parts[1])].append(parts[2])
    for i, suffixes in by_layer.items():
        arch.check_layer(path, i, suffixes, spec.is_moe)


def _stored(path: Path, shard: Shard, index: int, spec: ModelSpec, arch: Arch,
            device: torch.device) -> Stored:
    t = shard.layout.tensors[index]
    kind = _kind(t.type_id)
    shape = tuple(reversed(t.ne))
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    if len(shape) == 1:  # a vector: one element per row (a q/k bias unpermutes by rows too)
        values, kind = _floats(path, shard, index).reshape(-1, 1), "F32"
    elif kind == "BF16" or is_bias(t.name):  # gpt-oss's per-expert biases [E, N]: float32
        values, kind = _floats(path, shard, index).reshape(rows, -1), "F32"
    else:
        raw = _read(shard, index)
        values = raw.view(_FLOATS.get(kind, np.uint8)).reshape(rows, -1)
    if arch.permuted_qk:
        values = _unpermute(t.name, values, spec)
    data = torch.from_numpy(np.ascontiguousarray(values))
    if len(shape) == 1:
        data = data.reshape(-1)
    return Stored(kind, data.to(device), shape)


# llama.cpp permutes the rows of these (biases too: convert_hf_to_gguf permutes q/k_proj.bias)
_PERMUTED = {".attn_q.weight": "q", ".attn_q.bias": "q", ".attn_k.weight": "k",
             ".attn_k.bias": "k"}


def _unpermute(name: str, rows: np.ndarray, spec: ModelSpec) -> np.ndarray:
    which = next((v for k, v in _PERMUTED.items() if name.endswith(k)), None)
    if which is None:
        return rows
    return unpermute_rows(rows, spec.n_heads if which == "q" else spec.n_kv_heads)


def _floats(path: Path, shard: Shard, index: int) -> np.ndarray:
    """float32 values of a float-stored tensor (F32, F16, BF16) or a 1-D block tensor."""
    from strata.models.gguf_torch import dequantize

    return dequantize(path, shard, index)[0].astype(np.float32, copy=False)


def _read(shard: Shard, index: int) -> np.ndarray:
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
