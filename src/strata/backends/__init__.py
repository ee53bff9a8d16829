"""Backend registry: name -> module path, imported only when used (heavy deps stay lazy)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from strata.backends.base import Backend, BackendUnavailable

# name -> "module:factory". A backend file adds one line here; nothing else names it.
BACKENDS: dict[str, str] = {
    "llamacpp": "strata.backends.llamacpp:LlamaCppBackend",
    "torch": "strata.backends.torch_backend:TorchBackend",
    "openai": "strata.backends.openai:OpenAIBackend",
}

# Which model forms each backend consumes, so a sweep can skip impossible pairs up front.
ACCEPTS: dict[str, tuple[str, ...]] = {
    "llamacpp": ("gguf",),
    "torch": ("hf", "gguf"),
    "openai": ("endpoint",),
}


def create(name: str) -> Backend:
    """Instantiate a backend; BackendUnavailable (with the reason) if its extra is missing."""
    if name not in BACKENDS:
        from strata.errors import InputError

        raise InputError(f"--backend {name}: unknown backend (choose from {', '.join(BACKENDS)})")
    module, _, factory = BACKENDS[name].partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailable(f"{name}: {exc} (install the extra: pip install "
                                 f"'strata[{name}]')") from exc
    make: Callable[[], Backend] = getattr(mod, factory)
    return make()
