"""One pipeline stage of a Llama-family model: a contiguous range of layers, its own KV cache.

A stage holds only what its layers need: blocks [first, last), plus the token embedding on the
first stage and the final norm and output head on the last one (token_embd again when the head
is tied). Tensors are read one at a time through strata's bounds-checked GGUF reader
(strata.models.gguf) and dequantised to float32 by strata.models.gguf_torch, which also undoes
llama.cpp's Q/K row permutation; nothing else of the file is ever read, so no process holds the
whole model. The forward pass is plain float32 PyTorch, the same maths as transformers'
Llama/Qwen2 (rotate-half RoPE, GQA, SwiGLU, RMSNorm), written out here because a stage is a
slice of a model that transformers cannot build. A Hugging Face folder (config.json +
safetensors) loads through strata.ring.stage_hf, which reads only the stage's tensors and
leaves their rows as stored (HF checkpoints are not Q/K-permuted). Mixture-of-experts files
(qwen3moe, Mixtral) run through strata.ring.stage_moe: the stage holds every expert of its
layers and computes only the routed ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from strata.errors import InputError

try:  # the optional [torch] extra: one line, not a traceback, when it is missing
    import torch
    import torch.nn.functional as F
except ImportError as exc:
    raise InputError("strata ring runs on PyTorch (torch.distributed), which is not "
                     "installed: pip install 'strata[torch]'") from exc

from strata.models.gguf import Shard, scan_or_input_error, shards, spec_from_layout
from strata.models.gguf_torch import (
    ARCHS,
    ROPE_FREQS,
    ArchRule,
    dequantize,
    llama_config,
    unpermute_rows,
)
from strata.models.spec import OUTPUT, TOKEN_EMBD, ModelSpec
from strata.ring.stage_hf import hf_folder, load_hf, read_stage_hf
from strata.ring.stage_moe import (
    MOE_ARCHS,
    MOE_BLOCK_TENSORS,
    QK_NORM_ARCHS,
    Routing,
    head_norm,
    moe_ffn,
    routing,
)

FLOAT_BYTES = 4  # a stage computes and stores in float32
OUTPUT_NORM = "output_norm.weight"


def gguf_path(model_ref: str) -> Path:
    """The GGUF file of a model ref (a path, synthetic:<preset>[@quant], ollama:NAME)."""
    from strata.models.source import resolve

    return resolve(model_ref).path("gguf", "ring")


def wanted(name: str, first: int, last: int, n_layers: int, tied: bool) -> bool:
    """Does the stage holding layers [first, last) need GGUF tensor `name`?"""
    if name.startswith("blk."):
        index = name.split(".", 2)[1]
        return index.isdigit() and first <= int(index) < last
    if name == TOKEN_EMBD:  # the lookup on the first stage; the tied head on the last
        return first == 0 or (tied and last == n_layers)
    if name in (OUTPUT_NORM, OUTPUT):
        return last == n_layers
    return name == ROPE_FREQS  # every stage rotates its own queries and keys


def stage_bytes(spec: ModelSpec, first: int, last: int, ctx: int) -> tuple[int, int]:
    """(float32 weight bytes, KV-cache bytes at `ctx` positions) of a stage, from the spec alone
    (no tensor read): what a planner or a memory cap checks before anything is loaded."""
    weights = sum(int(np.prod(t.shape, dtype=np.int64)) * FLOAT_BYTES for t in spec.tensors
                  if wanted(t.name, first, last, spec.n_layers, spec.tied_embeddings))
    kv = 2 * (last - first) * spec.n_kv_heads * spec.head_dim * ctx * FLOAT_BYTES
    return weights, kv


def check_range(spec: ModelSpec, first: int, last: int) -> None:
    if not 0 <= first < last <= spec.n_layers:
        raise InputError(f"stage layers [{first}, {last}) are not a non-empty range of the "
                         f"model's {spec.n_layers} layers")


@dataclass
class KVCache:
    k: list[torch.Tensor]  # per local layer [Hkv, C, D]
    v: list[torch.Tensor]
    capacity: int


@dataclass
class Stage:
    ref: str  # the model ref it was loaded from (a stage is reused only for the same one)
    path: Path
    spec: ModelSpec
    rule: ArchRule
    config: dict[str, Any]  # gguf_torch.llama_config: eps, rope theta/scaling
    first: int
    last: int
    tensors: dict[str, torch.Tensor]  # GGUF names, float32, Q/K rows unpermuted
    rope_freqs: np.ndarray | None
    device: torch.device
    moe: Routing | None = None  # None: a dense model
    cache: KVCache | None = None
    pos: int = 0  # positions the cache holds
    _cos: torch.Tensor | None = field(default=None, repr=False)
    _sin: torch.Tensor | None = field(default=None, repr=False)

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def load(cls, model_ref: str | Path, first: int, last: int, device: str = "cpu",
             mem_cap_bytes: int | None = None, ctx: int = 0) -> Stage:
        """Read only the tensors of layers [first, last) (+ embedding / norm and head at the
        ends); InputError when the file cannot run here or the share exceeds `mem_cap_bytes`
        (weights + a KV cache of `ctx` positions), before any tensor is read."""
        folder = hf_folder(str(model_ref))
        if folder is not None:  # a Hugging Face directory: safetensors, rows as stored
            return cls._load_hf(str(model_ref), folder, first, last, device, mem_cap_bytes,
                                ctx)
        path = gguf_path(str(model_ref))
        layout, sizes = scan_or_input_error(path)
        arch = layout.kv.get("general.architecture")
        rules = {**ARCHS, **MOE_ARCHS}
        rule = rules.get(arch) if isinstance(arch, str) else None
        if rule is None:
            raise InputError(f"MODEL {path}: strata ring runs the {', '.join(rules)} "
                             f"architectures, not {arch}")
        files = shards(path, layout, sizes)
        spec = spec_from_layout(path, layout, [p for s in files for p in
                                               zip(s.layout.tensors, s.sizes, strict=True)])
        moe = routing(path, spec, layout.kv)
        check_range(spec, first, last)
        if mem_cap_bytes is not None:
            check_cap(spec, first, last, ctx, mem_cap_bytes)
        tensors, rope_freqs = _read_stage(path, files, spec, rule, first, last)
        biases = any(n.endswith(".bias") for n in tensors)
        vocab = next(t.shape[0] for t in spec.tensors if t.name == TOKEN_EMBD)
        config = llama_config(path, spec, layout.kv, rule, vocab, biases)
        dev = torch.device(device)
        return cls(str(model_ref), path, spec, rule, config, first, last,
                   {n: t.to(dev) for n, t in tensors.items()}, rope_freqs, dev, moe)

    @classmethod
    def _load_hf(cls, ref: str, folder: Path, first: int, last: int, device: str,
                 mem_cap_bytes: int | None, ctx: int) -> Stage:
        spec, rule, config = load_hf(folder)
        check_range(spec, first, last)
        if mem_cap_bytes is not None:
            check_cap(spec, first, last, ctx, mem_cap_bytes)
        dev = torch.device(device)
        tensors = {n: torch.from_numpy(np.ascontiguousarray(v)).to(dev)
                   for n, v in read_stage_hf(folder, spec, first, last).items()}
        return cls(ref, folder, spec, rule, config, first, last, tensors, None, dev)

    def holds(self, model_ref: str, first: int, last: int) -> bool:
        """Is this already the stage [first, last) of `model_ref` (nothing to reload)?"""
        return (self.ref, self.first, self.last) == (str(model_ref), first, last)

    @property
    def is_first(self) -> bool:
        return self.first == 0

    @property
    def is_last(self) -> bool:
        return self.last == self.spec.n_layers

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def kv_bytes(self, ctx: int) -> int:
        return stage_bytes(self.spec, self.first, self.last, ctx)[1]

    @property
    def vocab(self) -> int:
        return int(self.config["vocab_size"])

    # -- the cache --------------------------------------------------------------------------

    def reset(self, capacity: int) -> None:
        """An empty KV cache of `capacity` positions (the old one reused when big enough);
        capacity 0 frees it (the stage is idle between requests)."""
        s = self.spec
        if capacity <= 0:
            self.cache, self._cos, self._sin, self.pos = None, None, None, 0
            return
        if self.cache is None or self.cache.capacity < capacity:
            shape = (s.n_kv_heads, capacity, s.head_dim)
            n = self.last - self.first
            self.cache = KVCache([torch.zeros(shape, device=self.device) for _ in range(n)],
                                 [torch.zeros(shape, device=self.device) for _ in range(n)],
                                 capacity)
            self._cos, self._sin = self._rope_tables(capacity)
        self.pos = 0

    def _rope_tables(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [C, D/2] in float64 then rounded: the angles of late positions keep their
        precision (transformers computes them in float32; the difference is far below 1e-4)."""
        d = self.spec.head_dim
        inv = 1.0 / (float(self.config["rope_theta"]) **
                     (torch.arange(0, d, 2, dtype=torch.float64) / d))
        if self.rope_freqs is not None:  # Llama 3.x frequency factors divide the frequencies
            factors = torch.from_numpy(self.rope_freqs.astype(np.float64))
            if factors.shape != inv.shape:
                raise InputError(f"{ROPE_FREQS}: {factors.numel()} factors for "
                                 f"{inv.numel()} rotary frequencies")
            inv = inv / factors
        scaling = self.config.get("rope_scaling") or {}
        if scaling.get("rope_type") == "linear":
            inv = inv / float(scaling["factor"])
        angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
        return (angles.cos().float().to(self.device), angles.sin().float().to(self.device))

    # -- the forward pass -------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, pos: int, last_only: bool = False) -> torch.Tensor:
        """Run tokens at positions [pos, pos + T) through this stage's layers.

        x: int64 token ids [T] on the first stage, float32 activations [T, hidden] otherwise.
        Returns activations [T, hidden], or float32 logits [T, vocab] on the last stage
        ([1, vocab], the last position only, with `last_only`)."""
        if self.cache is None:
            raise RuntimeError("Stage.reset(capacity) before forward")
        t = x.shape[0]
        if pos < 0 or pos + t > self.cache.capacity:
            raise ValueError(f"positions {pos}..{pos + t} exceed the cache's "
                             f"{self.cache.capacity}")
        h = self.tensors[TOKEN_EMBD][x.to(self.device)] if self.is_first else \
            x.to(self.device, torch.float32)
        for local, layer in enumerate(range(self.first, self.last)):
            h = self._block(layer, local, h, pos)
        self.pos = pos + t
        if not self.is_last:
            return h
        if last_only:
            h = h[-1:]
        h = self._norm(h, OUTPUT_NORM)
        head = self.tensors.get(OUTPUT, self.tensors.get(TOKEN_EMBD))
        assert head is not None  # wanted() loads token_embd on a tied last stage
        return h @ head.T

    def _block(self, layer: int, local: int, x: torch.Tensor, pos: int) -> torch.Tensor:
        p = f"blk.{layer}."
        x = x + self._attention(p, local, self._norm(x, p + "attn_norm.weight"), pos)
        h = self._norm(x, p + "ffn_norm.weight")
        w = self.tensors
        if self.moe is not None:
            return x + moe_ffn(h, w, p, self.moe)
        return x + (F.silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
                    ) @ w[p + "ffn_down.weight"].T

    def _attention(self, p: str, local: int, h: torch.Tensor, pos: int) -> torch.Tensor:
        s, cache = self.spec, self.cache
        assert cache is not None and self._cos is not None and self._sin is not None
        t, d = h.shape[0], s.head_dim
        q = self._proj(h, p + "attn_q").view(t, s.n_heads, d).transpose(0, 1)
        k = self._proj(h, p + "attn_k").view(t, s.n_kv_heads, d).transpose(0, 1)
        v = self._proj(h, p + "attn_v").view(t, s.n_kv_heads, d).transpose(0, 1)
        if s.arch in QK_NORM_ARCHS:  # qwen3moe: every head RMS-normed before RoPE
            eps = float(self.config["rms_norm_eps"])
            q = head_norm(q, self.tensors[p + "attn_q_norm.weight"], eps)
            k = head_norm(k, self.tensors[p + "attn_k_norm.weight"], eps)
        cos, sin = self._cos[pos:pos + t], self._sin[pos:pos + t]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        end = pos + t
        cache.k[local][:, pos:end] = k
        cache.v[local][:, pos:end] = v
        # GQA: each KV head serves n_heads / n_kv_heads consecutive query heads
        rep = s.n_heads // s.n_kv_heads
        keys = cache.k[local][:, :end].repeat_interleave(rep, dim=0)
        values = cache.v[local][:, :end].repeat_interleave(rep, dim=0)
        # query i sits at position pos + i and sees keys 0..pos + i (causal at any depth)
        mask = torch.arange(end, device=self.device)[None, :] <= \
            torch.arange(pos, end, device=self.device)[:, None]
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                           scale=1.0 / math.sqrt(d))
        return o.transpose(0, 1).reshape(t, s.n_heads * d) @ self.tensors[
            p + "attn_output.weight"].T

    def _proj(self, h: torch.Tensor, name: str) -> torch.Tensor:
        out = h @ self.tensors[name + ".weight"].T
        bias = self.tensors.get(name + ".bias")  # qwen2's q/k/v biases
        return out if bias is None else out + bias

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        eps = float(self.config["rms_norm_eps"])
        return self.tensors[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on [H, T, D] with cos/sin [T, D/2] (transformers' convention: the
    pairs are (i, i + D/2); llama.cpp's interleaved pairs were unpermuted at load)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def check_cap(spec: ModelSpec, first: int, last: int, ctx: int, cap: int) -> None:
    weights, kv = stage_bytes(spec, first, last, ctx)
    if weights + kv > cap:
        raise InputError(
            f"layers [{first}, {last}) of {spec.name} need {_gib(weights + kv)} (weights "
            f"{_gib(weights)} + KV cache {_gib(kv)} at {ctx} positions, float32) but this "
            f"node may use {_gib(cap)}: {_gib(weights + kv - cap)} missing")


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**20 else f"{n / 2**10:.4g} KiB"


def _read_stage(path: Path, files: list[Shard], spec: ModelSpec, rule: ArchRule, first: int,
                last: int) -> tuple[dict[str, torch.Tensor], np.ndarray | None]:
    """Dequantise the stage's tensors, one at a time (the rest of the file is never read)."""
    tensors: dict[str, torch.Tensor] = {}
    rope_freqs = None
    for shard in files:
        for i, t in enumerate(shard.layout.tensors):
            if not wanted(t.name, first, last, spec.n_layers, spec.tied_embeddings):
                continue
            values, _stored = dequantize(path, shard, i)
            if t.name == ROPE_FREQS:
                rope_freqs = values.reshape(-1)
                continue
            if rule.permuted_qk and t.name.endswith(_PERMUTED):
                heads = spec.n_heads if ".attn_q." in t.name else spec.n_kv_heads
                values = unpermute_rows(values, heads)
            elif t.name.startswith("blk.") and t.name.split(".", 2)[2] not in (
                    _BLOCK_TENSORS | MOE_BLOCK_TENSORS):
                raise InputError(f"MODEL {path}: tensor {t.name!r} has no place in a "
                                 "Llama-family stage (another variant?)")
            tensors[t.name] = torch.from_numpy(np.ascontiguousarray(values))
    return tensors, rope_freqs


# llama.cpp permutes the rows of these (biases too, as gguf_torch undoes for transformers)
_PERMUTED = (".attn_q.weight", ".attn_k.weight", ".attn_q.bias", ".attn_k.bias")
_BLOCK_TENSORS = {
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_q.bias",
    "attn_k.bias", "attn_v.bias", "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight",
    "ffn_up.weight", "ffn_down.weight",
}
