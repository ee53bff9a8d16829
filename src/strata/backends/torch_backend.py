"""`torch` backend: Hugging Face transformers in-process on cpu / cuda / mps
(docs/architecture.md §5).

Run semantics are llama-bench's, so the three backends count and time the same things:
  * the depth prefix (@d<D>) is prefilled into a fresh KV cache before the clock starts;
  * the prompt (pp<N>) is one forward call over all N tokens; logits only for the last one;
  * each generated token (tg<M>) is one single-token forward whose input is a random token id
    (the first is BOS for a pure tg test): no sampling, EOS never stops the run, exactly M steps;
  * the device is synchronised at the end of the prompt and after every decoded token.

dtype "auto" means the checkpoint's own dtype, except half-precision checkpoints on CPU (see
`choose_dtype`): PyTorch's CPU half kernels are only fast where the CPU has native bf16.

A GGUF is read by strata's own loader (strata.models.gguf_torch: bounds-checked reader,
gguf-py dequantisation, config from the metadata, llama.cpp's Q/K permutation undone), not by
transformers' GGUF loading, which refuses valid files. Every weight is dequantised: the model
then runs in a float dtype, never with quantised kernels (info() says so). An architecture the
loader does not map gets an error naming the llamacpp backend, which runs GGUF natively.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import io
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from safetensors import SafetensorError

from strata.backends.base import LoadConfig, RunRequest, RunTrace, decode_inputs
from strata.backends.torch_device import (
    _STORED,
    DTYPES,  # noqa: F401  (the descriptor reads it from here)
    DtypeChoice,
    _name,
    choose_dtype,
    resolve_device,
)
from strata.errors import InputError
from strata.hardware.devices import sync
from strata.hardware.threads import set_threads
from strata.models.gguf import scan_or_input_error
from strata.models.hf import read_config, read_safetensors_header, safetensors_files
from strata.models.source import ResolvedModel

ATTN_IMPLEMENTATION = "sdpa"
GEN_INPUTS_NOTE = "decode inputs are random token ids, no sampling (as llama-bench)"




# -- device ----------------------------------------------------------------------------------










# -- dtype -----------------------------------------------------------------------------------








# -- checkpoint inspection (before transformers sees it, for one-line errors) --------------
# The files are read by strata.models (hf, gguf), which bounds-check every header and raise
# one InputError line naming the file; only the storage type -> torch dtype mapping is ours.


@dataclass
class Checkpoint:
    """What we learn about a model directory or GGUF file without loading the weights."""

    path: Path  # the directory (hf) or the .gguf file
    form: str  # "hf" or "gguf"
    dtype: torch.dtype  # the checkpoint's float dtype (a quantised GGUF counts as float16)
    nbytes: int  # weight bytes as stored
    stored: str = ""  # storage type as named by the file ("F16", "Q4_0", ...)
    arch: str = ""  # GGUF general.architecture
    label: str = ""  # what people call its quantisation: the file's mix ("Q4_K_M") or `stored`


def _main_type(sizes: Iterable[tuple[str, int]]) -> tuple[str, int]:
    """(storage type holding most bytes, total bytes) of (type, bytes) pairs."""
    by_type: dict[str, int] = {}
    for dtype, nbytes in sizes:
        by_type[dtype] = by_type.get(dtype, 0) + nbytes
    stored = max(by_type, key=by_type.__getitem__) if by_type else "F32"
    return stored, sum(by_type.values())


def inspect_hf_dir(path: Path) -> Checkpoint:
    config = read_config(path)
    tensors = [t for f in safetensors_files(path) for t in read_safetensors_header(f)]
    stored, nbytes = _main_type((t.dtype, t.nbytes) for t in tensors)
    value = config.values.get("dtype") or config.values.get("torch_dtype")  # 5.x / 4.x name
    dtype = _STORED.get(str(value)) if value else None
    return Checkpoint(path, "hf", dtype or _STORED.get(stored, torch.float32), nbytes, stored)


def inspect_gguf(path: Path) -> Checkpoint:
    # The validated header, not read_spec(): a GGUF that lacks the metadata strata's roofline
    # needs may still be one transformers loads, or refuses with a pointer to llamacpp.
    layout, sizes = scan_or_input_error(path)
    stored, nbytes = _main_type((s.type_name, s.nbytes) for s in sizes)
    from strata.models.mixes import file_type_name

    arch, ftype = layout.kv.get("general.architecture"), layout.kv.get("general.file_type")
    mix = file_type_name(ftype) if isinstance(ftype, int) else None
    return Checkpoint(path, "gguf", _STORED.get(stored, torch.float16), nbytes, stored,
                      arch if isinstance(arch, str) and arch else "?", mix or stored)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


# -- loading ---------------------------------------------------------------------------------


def _dtype_kwarg() -> str:
    """transformers 5 renamed from_pretrained's torch_dtype to dtype."""
    major = int(transformers.__version__.split(".")[0])
    return "dtype" if major >= 5 else "torch_dtype"


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers draws tqdm bars while loading; they would tear strata's own display."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        # the GGUF dequantising bar is plain tqdm on stderr, outside transformers' switch
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_model(ckpt: Checkpoint, device: torch.device, dtype: torch.dtype) -> Any:
    kwargs: dict[str, Any] = {_dtype_kwarg(): dtype, "attn_implementation": ATTN_IMPLEMENTATION,
                              "device_map": str(device)}
    with _no_progress_bars():
        if ckpt.form == "gguf":
            return _load_gguf(ckpt, kwargs)
        return _load_hf(ckpt, kwargs)


def _load_hf(ckpt: Checkpoint, kwargs: dict[str, Any]) -> Any:
    try:
        try:
            return transformers.AutoModelForCausalLM.from_pretrained(str(ckpt.path), **kwargs)
        except ValueError as exc:
            # a class without an SDPA path (GptOss: its attention sinks) runs transformers'
            # eager attention; the run's attn_implementation field says which ran
            if "scaled_dot_product_attention" not in str(exc):
                raise
            return transformers.AutoModelForCausalLM.from_pretrained(
                str(ckpt.path), **{**kwargs, "attn_implementation": "eager"})
    except (OSError, ValueError, KeyError, SafetensorError) as exc:  # damaged file, unknown arch
        raise InputError(f"{ckpt.path}: transformers cannot load it: {_one_line(exc)}") from None


def _load_gguf(ckpt: Checkpoint, kwargs: dict[str, Any]) -> Any:
    from strata.models.gguf_torch import load_gguf_model

    dtype = kwargs[_dtype_kwarg()]
    return load_gguf_model(ckpt.path, torch.device(kwargs["device_map"]), dtype,
                           kwargs["attn_implementation"])[0]


@dataclass(frozen=True)
class ForwardArgs:
    """Keyword names of the model's forward(), which transformers has renamed over releases."""

    cache: str  # "cache" (transformers >= 5.2x) or "past_key_values"
    cache_position: bool  # 4.x also wants the cache slots; newer releases derive them
    last_logits: str | None  # "logits_to_keep" or (before 4.49) "num_logits_to_keep"

    @classmethod
    def of(cls, model: Any) -> ForwardArgs:
        import inspect

        params = inspect.signature(model.forward).parameters
        last = next((n for n in ("logits_to_keep", "num_logits_to_keep") if n in params), None)
        return cls(cache="cache" if "cache" in params else "past_key_values",
                   cache_position="cache_position" in params, last_logits=last)


def _special_ids(config: Any) -> set[int]:
    ids: set[int] = set()
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, attr, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        ids.update(v for v in values if isinstance(v, int))
    return ids


def _first_id(value: Any) -> int | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, int) else None


# -- the backend -----------------------------------------------------------------------------


@dataclass
class _Loaded:
    model: Any
    device: torch.device
    choice: DtypeChoice
    ckpt: Checkpoint
    requested_dtype: str
    vocab: int
    allowed: np.ndarray  # non-special token ids
    bos: int | None
    max_positions: int | None
    forward_args: ForwardArgs
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))


class TorchBackend:
    """transformers model in-process; see the module docstring for the run semantics."""

    name = "torch"

    def __init__(self) -> None:
        self._state: _Loaded | None = None

    @property
    def model(self) -> Any:
        """The loaded transformers model (tests hook into it)."""
        return self._loaded().model

    # Backend protocol ---------------------------------------------------------------------

    def load(self, model: ResolvedModel, config: LoadConfig) -> None:
        self.close()
        device = resolve_device(config.device)
        ckpt = self._checkpoint(model)
        choice = choose_dtype(config.dtype, device, ckpt.dtype, ckpt.nbytes)
        set_threads(config.threads)  # every load: the count is process-wide state
        net = load_model(ckpt, device, choice.dtype)
        net.eval()
        self._state = _describe(net, device, choice, ckpt, config.dtype)

    def run(self, request: RunRequest) -> RunTrace:
        state = self._loaded()
        self._validate(request)
        with torch.inference_mode():
            return _Run(state, request).execute()

    def random_tokens(self, n: int, seed: int) -> list[int]:
        allowed = self._loaded().allowed
        return np.random.default_rng(seed).choice(allowed, size=n).tolist()

    def bos(self) -> int | None:
        return self._loaded().bos

    def info(self) -> dict[str, Any]:
        s = self._loaded()
        weights = "safetensors" if s.ckpt.form == "hf" else (
            f"GGUF {s.ckpt.label or s.ckpt.stored}, dequantised by strata (gguf-py) to "
            f"{_name(s.choice.dtype)}")
        return {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": str(s.device),
            "device_name": _device_name(s.device),
            "dtype": _name(_param_dtype(s.model)),
            "dtype_requested": s.requested_dtype,
            "dtype_rule": s.choice.rule,
            "checkpoint_dtype": s.ckpt.stored,
            "weights": weights,
            # what the forward pass streams: the roofline must use these bytes, not the file's
            "weight_bytes_in_memory": _param_bytes(s.model),
            "threads": torch.get_num_threads(),
            "attn_implementation": getattr(s.model.config, "_attn_implementation", None),
            "kv_cache": "DynamicCache (transformers' default for generate)",
            "kv_dtype": _name(_param_dtype(s.model)),  # the cache holds K/V in the model's dtype
            "gen_inputs": GEN_INPUTS_NOTE,
            **_llama_bench_fields(s.device),
        }

    def logits(self, tokens: list[int] | tuple[int, ...], start: int = 0) -> np.ndarray:
        """Logits at positions start..n-1 of `tokens` (positions 0..n-1, no cache): float32
        [n - start, vocab]; row j is the distribution of token start + j + 1. Not timed; for
        strata quality."""
        s = self._loaded()
        if not 0 <= start < len(tokens):
            raise ValueError(f"start {start} outside 0..{len(tokens) - 1}")
        self._validate(RunRequest(depth_tokens=(), prompt_tokens=tuple(tokens), n_gen=0))
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=s.device)
        kwargs: dict[str, Any] = {"position_ids": torch.arange(len(tokens), device=s.device)[None],
                                  "use_cache": False}
        if s.forward_args.last_logits:  # skip the output head for positions not wanted
            kwargs[s.forward_args.last_logits] = len(tokens) - start
        with torch.inference_mode():
            logits = s.model(input_ids=ids, **kwargs).logits[0]
        return logits[-(len(tokens) - start):, :s.vocab].float().cpu().numpy()

    def close(self) -> None:
        if self._state is None:
            return
        device = self._state.device
        self._state = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        elif device.type == "mps":
            torch.mps.empty_cache()

    # helpers --------------------------------------------------------------------------------

    def _loaded(self) -> _Loaded:
        if self._state is None:
            raise RuntimeError("torch backend: no model loaded (call load() first)")
        return self._state

    @staticmethod
    def _checkpoint(model: ResolvedModel) -> Checkpoint:
        # Prefer safetensors: a GGUF only reaches torch dequantised, which is not what it is.
        if "hf" in model.artefacts or "gguf" not in model.artefacts:
            return inspect_hf_dir(model.path("hf", "torch"))
        return inspect_gguf(model.path("gguf", "torch"))

    def _validate(self, request: RunRequest) -> None:
        s = self._loaded()
        if not request.prompt_tokens and request.n_gen <= 0:
            raise InputError("empty test: no prompt tokens and nothing to generate")
        needed = len(request.depth_tokens) + len(request.prompt_tokens) + request.n_gen
        if s.max_positions and needed > s.max_positions:
            raise InputError(f"test needs {needed} tokens of context; the model's maximum is "
                             f"{s.max_positions}")
        ids = (*request.depth_tokens, *request.prompt_tokens)
        if ids and (min(ids) < 0 or max(ids) >= s.vocab):
            raise InputError(f"token id out of range for a vocabulary of {s.vocab}")


def _describe(net: Any, device: torch.device, choice: DtypeChoice, ckpt: Checkpoint,
              requested: str) -> _Loaded:
    cfg = net.config
    rows = net.get_input_embeddings().num_embeddings
    vocab = min(rows, getattr(cfg, "vocab_size", None) or rows)
    allowed = np.setdiff1d(np.arange(vocab), np.array(sorted(_special_ids(cfg)), dtype=int))
    return _Loaded(model=net, device=device, choice=choice, ckpt=ckpt, requested_dtype=requested,
                   vocab=vocab, allowed=allowed, bos=_first_id(getattr(cfg, "bos_token_id", None)),
                   max_positions=getattr(cfg, "max_position_embeddings", None),
                   forward_args=ForwardArgs.of(net))


def _param_dtype(model: Any) -> torch.dtype:
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def _param_bytes(model: Any) -> int:
    # parameters() yields a tied tensor once, as the forward pass reads it
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _llama_bench_fields(device: torch.device) -> dict[str, str | None]:
    """llama-bench's cpu_info, gpu_info and backends for a torch row: the CPU's model name,
    the GPUs torch can see (", "-joined, "" when none), and the device kind this run used,
    spelled as llama-bench spells ggml backends (CPU, CUDA, ROCm, MPS)."""
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    if not gpus and device.type == "mps":
        gpus = ["Apple MPS"]
    kind = {"cuda": "ROCm" if getattr(torch.version, "hip", None) else "CUDA",
            "mps": "MPS"}.get(device.type, "CPU")
    return {"cpu_info": _cpu_name(), "gpu_info": ", ".join(gpus), "backends": kind}


@functools.cache
def _cpu_name() -> str | None:
    """The CPU's model name (info() runs once per test; the CPU does not change)."""
    from strata.hardware.cpu import probe_cpu

    return probe_cpu().model


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    import platform

    return platform.processor() or platform.machine()


def _new_cache(config: Any) -> Any:
    try:
        return transformers.DynamicCache(config=config)
    except TypeError:  # transformers < 4.56 takes no config
        return transformers.DynamicCache()


class _Run:
    """One request: everything not timed is prepared before the clock starts."""

    def __init__(self, state: _Loaded, request: RunRequest) -> None:
        self.s, self.req = state, request
        dev = state.device
        n_depth, n_prompt = len(request.depth_tokens), len(request.prompt_tokens)
        total = n_depth + n_prompt + request.n_gen
        # every input and position lives on the device up front: no host->device copy per step
        self.positions = torch.arange(total, device=dev).unsqueeze(0)
        self.depth = torch.tensor([request.depth_tokens], dtype=torch.long, device=dev)
        self.prompt = torch.tensor([request.prompt_tokens], dtype=torch.long, device=dev)
        self.gen = torch.tensor([self._gen_inputs()], dtype=torch.long, device=dev)
        self.cache = _new_cache(state.model.config)  # a fresh cache per request: no leaks
        self.pos = 0

    def _gen_inputs(self) -> list[int]:
        """Random decode inputs (no sampling); a pure tg test starts from BOS, as llama-bench."""
        return decode_inputs(self.req, lambda n: self.s.rng.choice(self.s.allowed,
                                                                     size=n).tolist(),
                             self.s.bos)

    def _forward(self, ids: torch.Tensor) -> None:
        n = ids.shape[1]
        pos = self.positions[:, self.pos:self.pos + n]
        names = self.s.forward_args
        kwargs: dict[str, Any] = {names.cache: self.cache, "use_cache": True,
                                  "position_ids": pos}
        if names.cache_position:
            kwargs["cache_position"] = pos[0]
        if names.last_logits:  # the lm_head over every prompt position would be waste
            kwargs[names.last_logits] = 1
        self.s.model(input_ids=ids, **kwargs)
        self.pos += n

    def execute(self) -> RunTrace:
        dev, n_prompt = self.s.device, self.prompt.shape[1]
        if self.depth.shape[1]:
            self._forward(self.depth)  # @d<D>: outside the timed region
        sync(dev)
        t_start = time.perf_counter_ns()
        if n_prompt:
            self._forward(self.prompt)
            sync(dev)
        t_prefill_end = time.perf_counter_ns() if n_prompt else t_start
        token_ns: list[int] = []
        for i in range(self.req.n_gen):
            self._forward(self.gen[:, i:i + 1])
            sync(dev)
            token_ns.append(time.perf_counter_ns())
        return RunTrace(n_prompt=n_prompt, n_gen=self.req.n_gen, t_start=t_start,
                        t_prefill_end=t_prefill_end, token_ns=token_ns, notes=[GEN_INPUTS_NOTE])
