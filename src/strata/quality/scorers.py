"""Per-position logits on each backend, with the same weights on every backend.

A scorer is a backend (strata.backends registry) that also has `logits(tokens, start)`. What
quality needs from each backend differs from what `bench` needs: each backend's descriptor
declares it (`scoring`: how to load it for --ctx, and which of the model's artefacts it
reads); SCORERS and BACKEND_CHOICES are derived from the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from strata.backends import create, describe, names, registry
from strata.backends.base import BackendUnavailable, LoadConfig
from strata.errors import InputError
from strata.models.source import ResolvedModel


class Scorer(Protocol):
    name: str

    def load(self, model: ResolvedModel, config: LoadConfig) -> None: ...

    def logits(self, tokens: list[int], start: int = 0) -> np.ndarray: ...

    def info(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ScorerKind:
    backend: str  # name in strata.backends
    config: Callable[[int], LoadConfig]  # --ctx -> how to load
    form: Callable[[ResolvedModel], ResolvedModel]  # which artefact it reads


def scorers() -> dict[str, ScorerKind]:
    """name -> how quality loads it, for every backend whose descriptor declares scoring."""
    return {n: ScorerKind(n, d.scoring.config, d.scoring.form)
            for n, d in registry().items() if d.scoring is not None}


def backend_choices() -> dict[str, tuple[str, ...]]:
    """--backend values -> backends, in run order; "auto" picks the first that takes the
    model, "both" runs every scorer that is part of auto."""
    every = names(scoring=True)
    default = tuple(n for n in every if describe(n).auto)  # lab runs only when named
    return {"auto": default, **{n: (n,) for n in every}, "both": default}


def __getattr__(attr: str) -> Any:
    # the old constant names, derived from the registry at each access
    if attr == "SCORERS":
        return scorers()
    if attr == "BACKEND_CHOICES":
        return backend_choices()
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def can_score(backend: str, model: ResolvedModel) -> bool:
    return any(form in model.artefacts for form in describe(backend).accepts)


def _installed(backend: str) -> bool:
    try:
        create(scorers()[backend].backend)  # imports the backend's libraries; loads nothing
    except BackendUnavailable:
        return False
    return True


def choose_backends(choice: str, models: list[ResolvedModel]) -> list[str]:
    """The backends a --backend value means for these models (InputError if none fits)."""
    choices = backend_choices()
    if choice not in choices:
        raise InputError(f"--backend {choice}: choose one of {', '.join(choices)}")
    fits = [b for b in choices[choice] if all(can_score(b, m) for m in models)]
    if choice == "auto":  # the first that takes the model and is installed
        installed = next(([b] for b in fits if _installed(b)), [])
        if fits and not installed:
            raise InputError(f"MODEL {models[0].ref}: scoring it needs the {' or '.join(fits)} "
                             f"backend, none is installed (pip install 'strata[{fits[0]}]')")
        fits = installed
    unfit = [b for b in choices[choice] if b not in fits]
    if choice != "auto" and unfit:
        model = next(m for m in models if not can_score(unfit[0], m))
        raise InputError(f"--backend {unfit[0]}: cannot run {model.ref} (it takes "
                         f"{' or '.join(describe(unfit[0]).accepts)}; this model is "
                         f"{', '.join(model.artefacts) or model.kind})")
    if not fits:
        raise InputError(f"MODEL {models[0].ref}: no backend can compute its logits (strata "
                         "quality needs a GGUF, a Hugging Face directory or a synthetic model)")
    return fits


def open_scorer(backend: str, model: ResolvedModel, ctx: int) -> Scorer:
    """A loaded scorer; a missing backend extra becomes a one-line InputError."""
    kind = scorers()[backend]
    try:
        scorer: Scorer = create(kind.backend)  # type: ignore[assignment]
        scorer.load(kind.form(model), kind.config(ctx))
    except BackendUnavailable as exc:
        raise InputError(f"--backend {backend}: {exc}") from None
    return scorer
