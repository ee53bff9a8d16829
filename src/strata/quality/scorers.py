"""Per-position logits on each backend, with the same weights on every backend.

A scorer is a backend (strata.backends registry) that also has `logits(tokens, start)`. What
quality needs from each backend differs from what `bench` needs, and lives here:

  llamacpp  the GGUF as llama.cpp runs it (quantised kernels, f16 KV cache: its defaults),
            context sized to --ctx
  torch     float32 on the CPU, so the figure measures the weights, not the arithmetic; the
            GGUF when the model has one (transformers dequantises it), because a synthetic
            model's safetensors hold *different* random weights, and a real model's GGUF is
            what was quantised — the HF directory only when there is no GGUF
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from strata.backends import ACCEPTS, create
from strata.backends.base import BackendUnavailable, LoadConfig
from strata.errors import InputError
from strata.models.source import ResolvedModel


class Scorer(Protocol):
    name: str

    def load(self, model: ResolvedModel, config: LoadConfig) -> None: ...

    def logits(self, tokens: list[int], start: int = 0) -> np.ndarray: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _same_model(model: ResolvedModel) -> ResolvedModel:
    return model


def _gguf_first(model: ResolvedModel) -> ResolvedModel:
    """The model restricted to its GGUF form when it has one (see the module docstring)."""
    if "gguf" not in model.artefacts:
        return model
    return ResolvedModel(ref=model.ref, kind=model.kind, spec=model.spec_for("gguf"),
                         model_name=model.model_name,
                         artefacts={"gguf": model.artefacts["gguf"]})


@dataclass(frozen=True)
class ScorerKind:
    backend: str  # name in strata.backends
    config: Callable[[int], LoadConfig]  # --ctx -> how to load
    form: Callable[[ResolvedModel], ResolvedModel]  # which artefact it reads


SCORERS: dict[str, ScorerKind] = {
    "llamacpp": ScorerKind("llamacpp", lambda ctx: LoadConfig(n_ctx=ctx, batch=max(ctx, 512)),
                           _same_model),
    "torch": ScorerKind("torch", lambda _ctx: LoadConfig(device="cpu", dtype="float32"),
                        _gguf_first),
}

# --backend values -> backends, in run order; "auto" picks the first that takes the model.
BACKEND_CHOICES: dict[str, tuple[str, ...]] = {
    "auto": ("llamacpp", "torch"),
    "llamacpp": ("llamacpp",),
    "torch": ("torch",),
    "both": ("llamacpp", "torch"),
}


def can_score(backend: str, model: ResolvedModel) -> bool:
    return any(form in model.artefacts for form in ACCEPTS[backend])


def _installed(backend: str) -> bool:
    try:
        create(SCORERS[backend].backend)  # imports the backend's libraries; loads nothing
    except BackendUnavailable:
        return False
    return True


def choose_backends(choice: str, models: list[ResolvedModel]) -> list[str]:
    """The backends a --backend value means for these models (InputError if none fits)."""
    if choice not in BACKEND_CHOICES:
        raise InputError(f"--backend {choice}: choose one of {', '.join(BACKEND_CHOICES)}")
    fits = [b for b in BACKEND_CHOICES[choice] if all(can_score(b, m) for m in models)]
    if choice == "auto":  # the first that takes the model and is installed
        installed = next(([b] for b in fits if _installed(b)), [])
        if fits and not installed:
            raise InputError(f"MODEL {models[0].ref}: scoring it needs the {' or '.join(fits)} "
                             f"backend, none is installed (pip install 'strata[{fits[0]}]')")
        fits = installed
    unfit = [b for b in BACKEND_CHOICES[choice] if b not in fits]
    if choice != "auto" and unfit:
        model = next(m for m in models if not can_score(unfit[0], m))
        raise InputError(f"--backend {unfit[0]}: cannot run {model.ref} (it takes "
                         f"{' or '.join(ACCEPTS[unfit[0]])}; this model is "
                         f"{', '.join(model.artefacts) or model.kind})")
    if not fits:
        raise InputError(f"MODEL {models[0].ref}: no backend can compute its logits (strata "
                         "quality needs a GGUF, a Hugging Face directory or a synthetic model)")
    return fits


def open_scorer(backend: str, model: ResolvedModel, ctx: int) -> Scorer:
    """A loaded scorer; a missing backend extra becomes a one-line InputError."""
    kind = SCORERS[backend]
    try:
        scorer: Scorer = create(kind.backend)  # type: ignore[assignment]
        scorer.load(kind.form(model), kind.config(ctx))
    except BackendUnavailable as exc:
        raise InputError(f"--backend {backend}: {exc}") from None
    return scorer
