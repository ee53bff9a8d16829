"""llama.cpp in-process through llama-cpp-python's low-level (ctypes) API.

Why the low-level API: `Llama.__call__` tokenises, samples and copies logits inside any
region we could time around it. Here the timed region holds nothing but `llama_decode` and
`llama_synchronize` calls on batches built beforehand, which is what llama-bench times:

  clear KV -> prefill depth (untimed) -> reset llama.cpp's perf counters -> t_start
  -> decode prompt in n_batch chunks (logits for the last token only) -> synchronize
  -> t_prefill_end -> n_gen x (decode one token, synchronize, timestamp)

Generated tokens are random ids, not sampled (llama-bench's method): sampling is not what is
measured, and random inputs cost the same forward pass. llama.cpp's own counters for the same
region (llama_perf_context) go into RunTrace.internal so the harness overhead can be checked.
"""

from __future__ import annotations

import ctypes
import os
import random
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from strata.backends.base import (
    BackendUnavailable,
    LoadConfig,
    RunRequest,
    RunTrace,
    decode_inputs,
)
from strata.errors import InputError, StrataError
from strata.models.source import ResolvedModel

try:
    import llama_cpp as _llama_mod
    import llama_cpp.llama_cpp as lc
except ImportError as _exc:  # registry turns this into "skipped: install the extra"
    raise BackendUnavailable(f"llamacpp: llama-cpp-python is not installed ({_exc})") from _exc

from strata.backends.llamacpp_info import build_info, llama_cpp_version

# the binding lacks GGML_TYPE_BF16: 30 is its value in ggml.h's enum ggml_type
KV_TYPES = {"f16": lc.GGML_TYPE_F16, "f32": lc.GGML_TYPE_F32,
            "bf16": getattr(lc, "GGML_TYPE_BF16", 30),
            "q8_0": lc.GGML_TYPE_Q8_0, "q4_0": lc.GGML_TYPE_Q4_0}
QUANTISED_KV = ("q8_0", "q4_0")
CTX_ROUND = 256  # n_ctx granularity when sized per request (llama.cpp pads to 256 anyway)
GEN_NOTE = ("generated tokens are random ids fed back one at a time (llama-bench's method), "
            "not sampled: sampling is outside what is measured")


# -- process-wide llama.cpp state ---------------------------------------------------------


class _Log:
    """Replaces llama.cpp's stderr logging: keeps the last error lines for our messages.

    The ctypes callback object must stay referenced for as long as llama.cpp may call it,
    so it lives on this module-level singleton.
    """

    ERROR, CONT = 4, 5  # ggml_log_level in ggml.h (llama_cpp/_logger.py's comment is stale)

    def __init__(self) -> None:
        self.errors: deque[str] = deque(maxlen=8)
        self.verbose = os.environ.get("STRATA_LLAMA_LOG") == "1"
        self._in_error = False
        self._cb = lc.llama_log_callback(self._on_log)

    def _on_log(self, level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
        msg = (text or b"").decode("utf-8", "replace")
        if level != self.CONT:
            self._in_error = level == self.ERROR
            if self._in_error and msg.strip():
                self.errors.append(msg.strip())
        elif self._in_error and self.errors and msg.strip():
            self.errors[-1] = f"{self.errors[-1]} {msg.strip()}"
        if self.verbose:
            os.write(2, msg.encode())

    def install(self) -> None:
        lc.llama_log_set(self._cb, ctypes.c_void_p(0))

    def last_error(self) -> str:
        """The most specific error llama.cpp logged: the first of the last failure (later
        lines are generic wrappers such as "failed to load model")."""
        return self.errors[0] if self.errors else ""


_LOG = _Log()
_BACKEND_READY = False


def _init_once() -> None:
    global _BACKEND_READY
    _LOG.install()  # again each load: importing llama_cpp.llama sets its own logger
    if not _BACKEND_READY:
        lc.llama_backend_init()
        _BACKEND_READY = True


def physical_cores() -> int:
    try:
        import psutil

        n = psutil.cpu_count(logical=False)
    except ImportError:
        n = None
    return max(1, n or os.cpu_count() or 1)


# -- batches ------------------------------------------------------------------------------


class _Batch:
    """A llama_batch for one sequence (seq 0), filled before any timing starts."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = lc.llama_batch_init(capacity, 0, 1)
        for i in range(capacity):
            self.raw.n_seq_id[i] = 1
            self.raw.seq_id[i][0] = 0

    def fill(self, tokens: list[int] | tuple[int, ...], pos0: int, logits_last: bool) -> None:
        raw = self.raw
        n = len(tokens)
        for i, tok in enumerate(tokens):
            raw.token[i] = tok
            raw.pos[i] = pos0 + i
            raw.logits[i] = 0
        if logits_last and n:
            raw.logits[n - 1] = 1
        raw.n_tokens = n

    def free(self) -> None:
        if self.raw is not None:
            lc.llama_batch_free(self.raw)
            self.raw = None


def _chunks(tokens: tuple[int, ...], size: int) -> list[tuple[int, ...]]:
    return [tokens[i:i + size] for i in range(0, len(tokens), size)]


def _round_up(n: int, step: int) -> int:
    return max(step, -(-n // step) * step)


# -- the backend --------------------------------------------------------------------------


@dataclass
class _Loaded:
    path: Path
    model: Any  # llama_model_p
    vocab: Any  # llama_vocab_p
    n_vocab: int
    normal_ids: list[int]  # ids with the NORMAL attribute: what random prompts draw from


class LlamaCppBackend:
    name = "llamacpp"

    def __init__(self) -> None:
        self._m: _Loaded | None = None
        self._cfg = LoadConfig()
        self._ctx: Any = None
        self._n_ctx = 0
        self._threads = 0
        self._gen_batch: _Batch | None = None
        self._ctx_notes: list[str] = []
        self._ran = False  # a run happened on this load (context re-creation is noted)

    # -- load / close ------------------------------------------------------------------
    def load(self, model: ResolvedModel, config: LoadConfig) -> None:
        self.close()
        for name, kv in (("kv_type", config.kv_type), ("kv_type_v", config.kv_type_v)):
            if kv not in KV_TYPES:
                raise InputError(f"{name} {kv}: llama.cpp KV types are {', '.join(KV_TYPES)}")
        if needs_flash_attn(config):  # llama.cpp's own error would only name the context
            raise InputError(f"V cache type {config.kv_type_v}: llama.cpp needs flash "
                             "attention for a quantised V cache; add -fa 1")
        path = model.path("gguf", self.name)
        if not path.is_file():
            raise InputError(f"{path}: no such GGUF file")
        _init_once()
        self._cfg = config
        self._threads = config.threads or physical_cores()
        self._m = self._load_model(path, config)
        # A context now even when n_ctx is sized per test: bad settings (a KV type this
        # model cannot use, no flash attention for a quantised V cache) fail at load.
        try:
            self._make_context(config.n_ctx or CTX_ROUND)
        except BaseException:
            self.close()  # do not keep the weights of a load that failed
            raise
        self._ran = False

    def _load_model(self, path: Path, config: LoadConfig) -> _Loaded:
        params = lc.llama_model_default_params()
        params.n_gpu_layers = config.n_gpu_layers
        _LOG.errors.clear()
        model = lc.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            why = _LOG.last_error() or "truncated or corrupt?"
            raise InputError(f"{path}: llama.cpp could not load this GGUF ({why})")
        vocab = lc.llama_model_get_vocab(model)
        n_vocab = lc.llama_vocab_n_tokens(vocab)
        normal = [t for t in range(n_vocab)
                  if lc.llama_vocab_get_attr(vocab, t) & lc.LLAMA_TOKEN_ATTR_NORMAL]
        if not normal:  # vocab without attributes: fall back to "not control, not EOG"
            normal = [t for t in range(n_vocab) if not lc.llama_vocab_is_control(vocab, t)
                      and not lc.llama_vocab_is_eog(vocab, t)]
        return _Loaded(path, model, vocab, n_vocab, normal)

    def _make_context(self, n_ctx: int) -> None:
        """(Re)create the context; the model stays loaded."""
        assert self._m is not None
        self._free_context()
        cfg = self._cfg
        p = lc.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = cfg.batch
        p.n_ubatch = min(cfg.ubatch, cfg.batch)
        p.n_threads = p.n_threads_batch = self._threads
        p.flash_attn_type = (lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if cfg.flash_attn
                             else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        p.type_k, p.type_v = KV_TYPES[cfg.kv_type], KV_TYPES[cfg.kv_type_v]
        p.no_perf = False  # we read llama.cpp's own timing counters
        _LOG.errors.clear()
        ctx = lc.llama_init_from_model(self._m.model, p)
        if not ctx:
            why = _LOG.last_error() or "unknown reason"
            raise InputError(f"{self._m.path}: llama.cpp could not create a context with "
                             f"n_ctx={n_ctx}, type_k={cfg.kv_type}, type_v={cfg.kv_type_v}, "
                             f"flash_attn={cfg.flash_attn} ({why})")
        self._ctx = ctx
        self._n_ctx = lc.llama_n_ctx(ctx)
        self._gen_batch = _Batch(1)

    def _free_context(self) -> None:
        if self._gen_batch is not None:
            self._gen_batch.free()
            self._gen_batch = None
        if self._ctx:
            lc.llama_free(self._ctx)
        self._ctx = None
        self._n_ctx = 0

    def close(self) -> None:
        self._free_context()
        if self._m is not None:
            lc.llama_model_free(self._m.model)
            self._m = None

    # -- vocabulary ----------------------------------------------------------------------
    def random_tokens(self, n: int, seed: int) -> list[int]:
        m = self._need_model()
        rng = random.Random(seed)
        return [rng.choice(m.normal_ids) for _ in range(n)]

    def bos(self) -> int | None:
        bos = lc.llama_vocab_bos(self._need_model().vocab)
        return None if bos < 0 else bos

    def _need_model(self) -> _Loaded:
        if self._m is None:
            raise StrataError("llamacpp: no model loaded")
        return self._m

    # -- the timed run -------------------------------------------------------------------
    def run(self, request: RunRequest) -> RunTrace:
        self._need_model()
        self._ensure_context(request)
        ctx = self._ctx
        depth, prompt, n_gen = request.depth_tokens, request.prompt_tokens, request.n_gen
        n_batch = lc.llama_n_batch(ctx)
        # Everything the timed region needs is prepared here: batches, random gen inputs.
        prompt_batches = self._prompt_batches(prompt, len(depth), n_batch)
        gen_inputs = self._gen_inputs(request)
        _LOG.errors.clear()  # a decode failure reports this run's errors, not older ones
        try:
            lc.llama_memory_clear(lc.llama_get_memory(ctx), False)
            self._prefill_untimed(depth, n_batch)
            lc.llama_perf_context_reset(ctx)  # counters cover exactly the timed region
            t_start, t_prefill_end = self._timed_prefill(prompt_batches)
            token_ns = self._timed_decode(gen_inputs, len(depth) + len(prompt))
            perf = lc.llama_perf_context(ctx)
        finally:
            for b in prompt_batches:
                b.free()
        trace = RunTrace(n_prompt=len(prompt), n_gen=n_gen, t_start=t_start,
                         t_prefill_end=t_prefill_end if prompt else None, token_ns=token_ns)
        trace.internal = _internal(perf)
        trace.notes = [*self._ctx_notes, GEN_NOTE] if n_gen else list(self._ctx_notes)
        self._ctx_notes = []
        self._ran = True
        return trace

    def _ensure_context(self, request: RunRequest) -> None:
        need = len(request.depth_tokens) + len(request.prompt_tokens) + request.n_gen
        if self._cfg.n_ctx:
            if need > self._n_ctx:
                raise InputError(f"test needs {need} tokens of context but n_ctx is "
                                 f"{self._n_ctx}: raise n_ctx or use 0 (sized per test)")
            return
        if need > self._n_ctx:
            old = self._n_ctx
            self._make_context(_round_up(need, CTX_ROUND))
            if self._ran:  # mid-sweep: the next warm-up absorbs the fresh context's first use
                self._ctx_notes.append(f"context re-created: n_ctx {old} -> {self._n_ctx}")

    def _prompt_batches(self, prompt: tuple[int, ...], pos0: int, n_batch: int) -> list[_Batch]:
        batches = []
        chunks = _chunks(prompt, n_batch)
        for i, chunk in enumerate(chunks):
            b = _Batch(len(chunk))
            b.fill(chunk, pos0, logits_last=i == len(chunks) - 1)
            batches.append(b)
            pos0 += len(chunk)
        return batches

    def _gen_inputs(self, request: RunRequest) -> list[int]:
        """The token fed at each decode step: BOS first for pure tg (llama-bench), then
        random normal ids (drawn here, before timing, so the RNG is not timed)."""
        seed = hash((request.prompt_tokens[:8], request.depth_tokens[:8], request.n_gen))
        return decode_inputs(request, lambda n: self.random_tokens(n, seed), self.bos())

    def _prefill_untimed(self, depth: tuple[int, ...], n_batch: int) -> None:
        batches = self._prompt_batches(depth, 0, n_batch)
        try:
            for b in batches:
                self._decode(b, "depth prefill")
            lc.llama_synchronize(self._ctx)
        finally:
            for b in batches:
                b.free()

    def _timed_prefill(self, batches: list[_Batch]) -> tuple[int, int]:
        ctx, decode, sync, now = self._ctx, lc.llama_decode, lc.llama_synchronize, \
            time.perf_counter_ns
        t_start = now()
        for b in batches:
            ret = decode(ctx, b.raw)
            if ret != 0:
                self._decode_failed(ret, "prompt")
        sync(ctx)
        return t_start, now()

    def _timed_decode(self, inputs: list[int], pos: int) -> list[int]:
        assert self._gen_batch is not None
        ctx, decode, sync, now = self._ctx, lc.llama_decode, lc.llama_synchronize, \
            time.perf_counter_ns
        raw = self._gen_batch.raw
        raw.n_tokens = 1
        raw.logits[0] = 1
        token, positions = raw.token, raw.pos
        stamps: list[int] = []
        append = stamps.append
        for i, tok in enumerate(inputs):
            token[0] = tok
            positions[0] = pos + i
            ret = decode(ctx, raw)
            if ret != 0:
                self._decode_failed(ret, f"generated token {i + 1}")
            sync(ctx)
            append(now())
        return stamps

    def _decode(self, batch: _Batch, what: str) -> None:
        ret = lc.llama_decode(self._ctx, batch.raw)
        if ret != 0:
            self._decode_failed(ret, what)

    def _decode_failed(self, ret: int, what: str) -> None:
        why = _LOG.last_error() or ("no KV slot: context too small" if ret == 1 else "")
        raise StrataError(f"llama_decode failed (ret {ret}) during the {what}: {why}".rstrip(": "))

    # -- per-position logits (strata quality) --------------------------------------------
    def logits(self, tokens: list[int] | tuple[int, ...], start: int = 0) -> np.ndarray:
        """Logits at positions start..n-1 of `tokens`, decoded from an empty KV cache at
        positions 0..n-1: float32 [n - start, n_vocab]; row j is the distribution of token
        start + j + 1. Earlier positions only fill the cache (no output-head work). Not timed;
        for strata quality."""
        m = self._need_model()
        if not 0 <= start < len(tokens):
            raise ValueError(f"start {start} outside 0..{len(tokens) - 1}")
        self._ensure_context(RunRequest(depth_tokens=(), prompt_tokens=tuple(tokens), n_gen=0))
        ctx = self._ctx
        out = np.empty((len(tokens) - start, m.n_vocab), dtype=np.float32)
        _LOG.errors.clear()
        lc.llama_memory_clear(lc.llama_get_memory(ctx), False)
        batches = self._prompt_batches(tuple(tokens), 0, lc.llama_n_batch(ctx))
        try:
            for b in batches:
                self._decode_rows(b, start, out)
        finally:
            for b in batches:
                b.free()
        return out

    def _decode_rows(self, b: _Batch, start: int, out: np.ndarray) -> None:
        """Decode one batch asking for the logits of positions >= start; copy them out."""
        raw = b.raw
        pos = [raw.pos[i] for i in range(raw.n_tokens)]
        for i, p in enumerate(pos):
            raw.logits[i] = int(p >= start)
        self._decode(b, "logits pass")
        wanted = [p for p in pos if p >= start]
        if wanted:  # llama.cpp packs the requested rows in batch order
            rows = np.ctypeslib.as_array(lc.llama_get_logits(self._ctx),
                                         shape=(len(wanted), out.shape[1]))
            out[wanted[0] - start:wanted[-1] - start + 1] = rows

    # -- description ---------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        cfg = self._cfg
        out: dict[str, Any] = {
            "backend": self.name,
            "llama_cpp_python": _llama_mod.__version__,
            "llama_cpp": llama_cpp_version(),
            **build_info(),
            "system_info": lc.llama_print_system_info().decode("utf-8", "replace").strip(),
            "gpu_offload_supported": bool(lc.llama_supports_gpu_offload()),
            "n_gpu_layers": cfg.n_gpu_layers,
            "kv_type": cfg.kv_type,
            "kv_type_v": cfg.kv_type_v,
            "flash_attn": cfg.flash_attn,
            "n_ubatch": cfg.ubatch,
            "generation": "random token ids, one decode + synchronize per token",
        }
        if self._ctx:
            out.update(threads=lc.llama_n_threads(self._ctx),
                       threads_batch=lc.llama_n_threads_batch(self._ctx),
                       n_batch=lc.llama_n_batch(self._ctx), n_ubatch=lc.llama_n_ubatch(self._ctx),
                       n_ctx=self._n_ctx)
        else:
            out.update(threads=self._threads, threads_batch=self._threads, n_batch=cfg.batch,
                       n_ctx=cfg.n_ctx or "per test")
        if self._m is not None:
            out.update(model_file=str(self._m.path), n_vocab=self._m.n_vocab)
        return out


def needs_flash_attn(config: LoadConfig) -> bool:
    """llama.cpp refuses a quantised V cache without flash attention (a quantised K cache
    works either way): llama_init_from_model, 'quantized V cache requires flash_attn'."""
    return config.kv_type_v in QUANTISED_KV and not config.flash_attn


def _internal(perf: Any) -> dict[str, float]:
    """llama.cpp's counters for the timed region. It reports max(1, n) for the counts, so a
    count whose time is exactly zero (that phase never ran) is reported as 0 here."""
    return {
        "t_p_eval_ms": float(perf.t_p_eval_ms),
        "n_p_eval": float(perf.n_p_eval if perf.t_p_eval_ms > 0 else 0),
        "t_eval_ms": float(perf.t_eval_ms),
        "n_eval": float(perf.n_eval if perf.t_eval_ms > 0 else 0),
    }
