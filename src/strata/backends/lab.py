"""`lab` backend: a GGUF on the kernel lab's own kernels (strata.lab), weights as stored.

Run semantics are llama-bench's, as for the other in-process backends
(backends/torch_backend.py): the depth is prefilled before the clock starts, the prompt is
one prefill (in ubatch chunks), each generated token is one decode step whose input is a
random token id (BOS first for a pure tg test), and the device is synchronised at the end of
the prompt and after every token. `info()` names the implementation that served each op
(dispatch's decision and why) and the torch compute ops a decode step ran (glue).
"""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np
import torch

from strata.backends.base import LoadConfig, RunRequest, RunTrace, decode_inputs
from strata.errors import InputError
from strata.hardware.devices import resolve, sync
from strata.models.source import ResolvedModel

GEN_INPUTS_NOTE = "decode inputs are random token ids, no sampling (as llama-bench)"
CTX_STEP = 256  # the cache grows in steps, so a sweep does not reallocate per request


class LabBackend:
    name = "lab"

    def __init__(self) -> None:
        self._model: Any = None
        self._info: dict[str, Any] = {}
        self._allowed = np.zeros(0, dtype=np.int64)
        self._bos: int | None = None
        self._rng = np.random.default_rng(0)

    @property
    def model(self) -> Any:
        if self._model is None:
            raise RuntimeError("lab backend: no model loaded (call load() first)")
        return self._model

    # Backend protocol ---------------------------------------------------------------------

    def load(self, model: ResolvedModel, config: LoadConfig) -> None:
        import strata.lab

        if config.kv_type != config.kv_type_v:
            raise InputError(f"-ctk {config.kv_type} -ctv {config.kv_type_v}: -B lab keeps K "
                             "and V in one type; give both f16 or both f32")
        self.close()
        self._model = strata.lab.load(model.path("gguf", "lab"), config.device,
                                      n_ctx=config.n_ctx or CTX_STEP, threads=config.threads,
                                      kv=config.kv_type)
        cfg = self._model.weights.config
        vocab = self._model.vocab
        special = {cfg.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        self._allowed = np.setdiff1d(np.arange(vocab), np.array(
            sorted(i for i in special if isinstance(i, int)), dtype=np.int64))
        self._bos = cfg.get("bos_token_id")
        self._info = self._describe()

    def run(self, request: RunRequest) -> RunTrace:
        self._validate(request)
        with torch.inference_mode():
            return self._execute(request)

    def random_tokens(self, n: int, seed: int) -> list[int]:
        return np.random.default_rng(seed).choice(self._allowed, size=n).tolist()

    def bos(self) -> int | None:
        return self._bos

    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def logits(self, tokens: list[int] | tuple[int, ...], start: int = 0) -> np.ndarray:
        """float32 [n - start, vocab]: row j is the distribution of token start + j + 1
        (positions 0..n-1, a fresh cache). Not timed; for strata quality."""
        if not 0 <= start < len(tokens):
            raise ValueError(f"start {start} outside 0..{len(tokens) - 1}")
        self._validate(RunRequest(depth_tokens=(), prompt_tokens=tuple(tokens), n_gen=0))
        m = self.model
        with torch.inference_mode():
            m.reset(_capacity(len(tokens)))
            return m.prefill(list(tokens), logits_from=start).cpu().numpy()

    def close(self) -> None:
        if self._model is None:
            return
        device = self._model.device
        self._model = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # helpers --------------------------------------------------------------------------------

    def _describe(self) -> dict[str, Any]:
        from strata.lab.accounting import torch_ops

        m = self.model
        w = m.weights
        m.reset(_capacity(3))
        token = int(self._allowed[0])
        with torch.inference_mode():
            m.prefill([token])
            m.decode(token)  # binds the decode step (its one-time contract checks)
            seen = torch_ops(lambda: m.decode(token))  # one observed step
        kinds = sorted({t.kind for t in w.tensors.values() if len(t.shape) == 2})
        return {
            "torch": torch.__version__,
            "device": resolve(m.device).torch,
            "weights": f"GGUF as stored ({', '.join(kinds)}), never dequantised",
            "weight_bytes_in_memory": sum(t.nbytes for t in w.tensors.values()),
            "threads": m.threads,
            "kv_cache": f"{m.kv_dtype}".removeprefix("torch.") + ", one [Hkv, C, D] pair per "
                        "layer",
            "kv_dtype": m.kv,
            "ops": m.kernels.served(),
            "torch_compute_per_token": dict(seen.get("compute", {})),
            # the glue strata's decode-step runner does in C instead (lab/runner.py)
            "runner_glue_per_token": dict(m._step.program.native_glue()),
            "gen_inputs": GEN_INPUTS_NOTE,
        }

    def _validate(self, request: RunRequest) -> None:
        if not request.prompt_tokens and request.n_gen <= 0:
            raise InputError("empty test: no prompt tokens and nothing to generate")
        ids = (*request.depth_tokens, *request.prompt_tokens)
        if ids and (min(ids) < 0 or max(ids) >= self.model.vocab):
            raise InputError(f"token id out of range for a vocabulary of {self.model.vocab}")

    def _execute(self, request: RunRequest) -> RunTrace:
        m = self.model
        total = len(request.depth_tokens) + len(request.prompt_tokens) + request.n_gen
        m.reset(_capacity(total))
        gen = decode_inputs(request, lambda n: self._rng.choice(self._allowed, size=n).tolist(),
                            self._bos)
        if request.depth_tokens:
            m.prefill(list(request.depth_tokens))  # @d<D>: outside the timed region
        sync(m.device)
        t_start = time.perf_counter_ns()
        if request.prompt_tokens:
            m.prefill(list(request.prompt_tokens))
            sync(m.device)
        t_prefill_end = time.perf_counter_ns() if request.prompt_tokens else t_start
        token_ns: list[int] = []
        for token in gen:
            m.decode(token)
            sync(m.device)
            token_ns.append(time.perf_counter_ns())
        return RunTrace(n_prompt=len(request.prompt_tokens), n_gen=request.n_gen,
                        t_start=t_start, t_prefill_end=t_prefill_end, token_ns=token_ns,
                        notes=[GEN_INPUTS_NOTE, *self._kernel_notes()])

    def _kernel_notes(self) -> list[str]:
        """A figure that includes torch standing in for a missing kernel says so."""
        ops = self._info.get("ops", {})
        fallback = sorted(op for op, d in ops.items() if d["outcome"] == "fallback")
        if not fallback:
            return []
        return [f"lab: no verified kernel here for {', '.join(fallback)}: torch's op stood in "
                "(strata kernels verify OP)"]


def _capacity(tokens: int) -> int:
    return -(-max(tokens, 1) // CTX_STEP) * CTX_STEP

