"""One pipeline stage: a contiguous range of layers on the engine's executor, its own KV cache.

A stage holds only what its layers need: blocks [first, last), plus the token embedding on the
first stage and the final norm and output head on the last one (token_embd again when the head
is tied). Tensors are read one at a time through strata's bounds-checked GGUF reader
(strata.engine.weights); nothing else of the file is ever read, so no process holds the whole
model. The forward pass is strata's one executor (strata.engine.executor) with the ops the
member chose: `lab` (default) keeps the GGUF's blocks as stored and runs the kernel lab's
verified kernels; `torch` dequantises to float32 (the reference twin, 4 bytes a weight).
Mixture-of-experts files (qwen3moe, Mixtral) route experts in the executor: the stage holds
every expert of its layers and computes only the routed ones. A Hugging Face folder
(config.json + safetensors) loads through strata.ring.runtime.stage_hf, which reads only the stage's
tensors, widened to float32, rows as stored (HF checkpoints are not Q/K-permuted).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.errors import InputError

try:  # the optional [torch] extra: one line, not a traceback, when it is missing
    import torch
except ImportError as exc:
    raise InputError("strata ring runs on PyTorch (torch.distributed), which is not "
                     "installed: pip install 'strata[torch]'") from exc

from strata.engine import ops as ops_registry
from strata.engine.executor import Executor
from strata.engine.kvcache import kv_type
from strata.engine.weights import ModelWeights, Stored, range_bytes, read_range
from strata.models import arch as arch_registry
from strata.models.spec import ModelSpec
from strata.ring.runtime.stage_hf import hf_folder, load_hf, read_stage_hf

DEFAULT_OPS = ops_registry.DEFAULT


def gguf_path(model_ref: str) -> Path:
    """The GGUF file of a model ref (a path, synthetic:<preset>[@quant], ollama:NAME)."""
    from strata.models.source import resolve

    return resolve(model_ref).path("gguf", "ring")


def stage_bytes(spec: ModelSpec, first: int, last: int, ctx: int, ops: str = DEFAULT_OPS,
                kv: str = "f32") -> tuple[int, int]:
    """(weight bytes as the stage holds them, KV-cache bytes at `ctx` positions in `kv`) of
    layers [first, last), from the spec alone (no tensor read): what a planner or a memory
    cap checks before anything is loaded. Lab ops hold a GGUF as stored; torch ops, and
    any Hugging Face folder, float32. A sliding-window layer's cache holds its window (the
    executor's windowed rows), any other layer's the whole context."""
    from strata.engine.executor import Cache

    as_float = ops == "torch" or spec.source == "hf"
    a = arch_registry.find(spec.arch)
    rows = sum(Cache.rows(ctx, spec.sliding_window)
               if a is not None and a.windowed(i, spec.sliding_window) else ctx
               for i in range(first, last))
    cache = 2 * rows * spec.n_kv_heads * kv_type(kv).row_bytes(spec.head_dim)
    return range_bytes(spec, first, last, as_float), cache


def check_range(spec: ModelSpec, first: int, last: int) -> None:
    if not 0 <= first < last <= spec.n_layers:
        raise InputError(f"stage layers [{first}, {last}) are not a non-empty range of the "
                         f"model's {spec.n_layers} layers")


@dataclass
class Routing:
    """How a MoE stage's layers pick their experts (what the executor reads from the file)."""

    n_experts: int
    n_used: int
    renormalise: bool


@dataclass
class Stage:
    ref: str  # the model ref it was loaded from (a stage is reused only for the same one)
    path: Path
    ops: str
    executor: Executor
    _step: Any = None  # lab.decode.DecodeStep bound to `_step_cache`
    _step_cache: Any = None

    # -- loading ----------------------------------------------------------------------------

    @classmethod
    def load(cls, model_ref: str | Path, first: int, last: int, device: str = "cpu",
             mem_cap_bytes: int | None = None, ctx: int = 0, ops: str = DEFAULT_OPS,
             say: Any = lambda _m: None, kv: str = "f32") -> Stage:
        """Read only the tensors of layers [first, last) (+ embedding / norm and head at the
        ends), to run over a `kv` (f32, f16, q8_0) K/V cache; InputError when the file cannot run
        here or the share exceeds `mem_cap_bytes` (weights as held + a KV cache of `ctx`
        positions), before any tensor is read."""
        if ops not in ops_registry.names():
            raise InputError(f"--ops {ops}: choose one of {', '.join(ops_registry.names())}")
        cache = kv_type(kv)
        dev = torch.device(device)

        def check(spec: ModelSpec) -> None:
            check_range(spec, first, last)
            cache.check(spec.head_dim)
            if mem_cap_bytes is not None:
                check_cap(spec, first, last, ctx, mem_cap_bytes, ops, kv)

        folder = hf_folder(str(model_ref))
        if folder is not None:  # a Hugging Face directory: safetensors, rows as stored
            weights, path = _load_hf(folder, first, last, dev, check), folder
        else:
            path = gguf_path(str(model_ref))
            weights = read_range(path, first, last, dev, "strata ring", check)
        executor = Executor.build(weights, ops_registry.make(ops, weights, dev, say, kv), dev,
                                  kv_dtype=cache.dtype)
        return cls(str(model_ref), path, ops, executor)

    def on_torch(self) -> list[str]:
        """The ops this stage runs on torch's own path: every op under --ops torch; under
        lab, those with no verified kernel on this machine (dispatch's fallback)."""
        kernels = getattr(self.executor.ops, "kernels", None)
        if kernels is None:
            return ["all"]
        return sorted(op for op, choice in kernels.choices.items() if choice.is_fallback)

    def holds(self, model_ref: str, first: int, last: int, ops: str | None = None,
              kv: str | None = None) -> bool:
        """Is this already the stage [first, last) of `model_ref` (nothing to reload)?"""
        return (self.ref, self.first, self.last) == (str(model_ref), first, last) and \
            (ops is None or ops == self.ops) and (kv is None or kv == self.kv)

    # -- what it holds ----------------------------------------------------------------------

    @property
    def spec(self) -> ModelSpec:
        return self.executor.weights.spec

    @property
    def config(self) -> dict[str, Any]:
        return self.executor.weights.config

    @property
    def first(self) -> int:
        return self.executor.first

    @property
    def last(self) -> int:
        return self.executor.last

    @property
    def device(self) -> torch.device:
        return self.executor.device

    @property
    def tensors(self) -> dict[str, Any]:
        """GGUF name -> the tensor as the ops hold it (lab: matrices as stored)."""
        return self.executor.held

    @property
    def moe(self) -> Routing | None:
        s = self.spec
        if not s.is_moe:
            return None
        return Routing(s.n_experts, s.n_experts_used,
                       bool(self.config.get("expert_weights_norm", True)))

    @property
    def is_first(self) -> bool:
        return self.executor.is_first

    @property
    def is_last(self) -> bool:
        return self.executor.is_last

    @property
    def weight_bytes(self) -> int:
        return self.executor.weight_bytes

    @property
    def kv(self) -> str:
        """The K/V cache's element type (f32, f16, q8_0), as the executor holds it."""
        return self.executor.kv

    def kv_bytes(self, ctx: int) -> int:
        return stage_bytes(self.spec, self.first, self.last, ctx, self.ops, self.kv)[1]

    @property
    def vocab(self) -> int:
        return self.executor.vocab

    @property
    def pos(self) -> int:
        return self.executor.pos

    # -- the cache and the forward pass -----------------------------------------------------

    def reset(self, capacity: int) -> None:
        """An empty KV cache of `capacity` positions (the old one reused when big enough),
        the decode step bound to it now (a request's set-up, not its first token's gap);
        capacity 0 frees both."""
        self.executor.reset(capacity)
        if capacity > 0:
            self._decode_step()

    def idle(self) -> None:
        """Between requests: the cache and its bound step stay for the next request (as
        llama.cpp's server keeps its context), which reuses them when they are big enough;
        binding a step again costs ~0.2 s (~400 calls checked and bound)."""
        self.executor.pos = 0

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, pos: int, last_only: bool = False) -> torch.Tensor:
        """Run tokens at positions [pos, pos + T) through this stage's layers.

        x: int64 token ids [T] on the first stage, float32 activations [T, hidden] otherwise.
        Returns activations [T, hidden], or float32 logits [T, vocab] on the last stage
        ([1, vocab], the last position only, with `last_only`)."""
        if self.executor.cache is None:
            raise RuntimeError("Stage.reset(capacity) before forward")
        if x.shape[0] == 1 and (step := self._decode_step()) is not None:
            return step(x, pos)  # one position: the bound step, as -B lab decodes
        out = self.executor.forward(x, pos, x.shape[0] - 1 if last_only else 0)
        assert out is not None
        return out

    def _decode_step(self) -> Any:
        """The lab's bound decode step over this stage's layers (every kernel call bound
        once per KV cache, run by strata's runner), or None for ops without kernels."""
        if not hasattr(self.executor.ops, "kernels"):
            return None
        cache = self.executor.cache
        if self._step is None or self._step_cache is not cache:
            from strata.lab.decode import DecodeStep

            self._step, self._step_cache = DecodeStep.build(self.executor), cache
        return self._step


def _load_hf(folder: Path, first: int, last: int, device: torch.device, check: Any
             ) -> ModelWeights:
    import numpy as np

    spec, _rule, config = load_hf(folder)
    check(spec)
    arch = arch_registry.get(spec.arch, "strata ring")
    tensors = {n: Stored("F32", torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
                         .to(device), tuple(v.shape))
               for n, v in read_stage_hf(folder, spec, first, last).items()}
    return ModelWeights(folder, spec, arch, config, first, last, tensors)


def check_cap(spec: ModelSpec, first: int, last: int, ctx: int, cap: int,
              ops: str = DEFAULT_OPS, kv: str = "f32") -> None:
    weights, cache = stage_bytes(spec, first, last, ctx, ops, kv)
    if weights + cache > cap:
        held = "float32" if ops == "torch" or spec.source == "hf" else "as stored"
        raise InputError(
            f"layers [{first}, {last}) of {spec.name} need {_gib(weights + cache)} (weights "
            f"{_gib(weights)} {held} + KV cache {_gib(cache)} at {ctx} positions, {kv}) but "
            f"this node may use {_gib(cap)}: {_gib(weights + cache - cap)} missing")


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**20 else f"{n / 2**10:.4g} KiB"
