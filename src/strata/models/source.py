"""Resolve what the user typed (MODEL) into a ResolvedModel, through a registry of sources.

  synthetic:<preset>[@<quant>]   random weights with a preset's exact shapes (cached)
  path/to/model.gguf             a GGUF file
  path/to/hf-dir/                a Hugging Face directory (config.json + *.safetensors)
  http://host:port[/v1]          an OpenAI-compatible endpoint (with --model-name)
  ollama:NAME[:TAG]              a model pulled with Ollama: its GGUF blob, and the running
                                 Ollama server as its endpoint
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from strata.errors import InputError
from strata.models.spec import ModelSpec


@dataclass
class ResolvedModel:
    ref: str  # what the user typed
    kind: str  # "synthetic", "gguf", "hf", "endpoint"
    spec: ModelSpec | None  # None for an endpoint (no weights to read)
    endpoint: str | None = None  # where a server runs it (an endpoint; ollama:NAME too)
    model_name: str | None = None
    # format -> path, or -> a callable that writes the artefact on first use (synthetic)
    artefacts: dict[str, Path | Callable[[], Path]] = field(default_factory=dict)
    # format -> spec of that artefact where it differs from `spec` (a synthetic @q4_0 model is
    # Q4_0 as GGUF but F16 as safetensors: the torch backend streams the F16 bytes)
    specs: dict[str, ModelSpec] = field(default_factory=dict)

    def spec_for(self, fmt: str) -> ModelSpec | None:
        """The spec of the model as `fmt` ("gguf", "hf") — what a backend of that format reads."""
        return self.specs.get(fmt, self.spec)

    def path(self, fmt: str, backend: str) -> Path:
        """The model as `fmt` ("gguf" or "hf"), materialised on demand; InputError if this
        source has no such form (the message names a backend that can run it)."""
        art = self.artefacts.get(fmt)
        if art is None:
            have = ", ".join(self.artefacts) or "none"
            raise InputError(f"{self.ref}: the {backend} backend needs a {fmt} model; this "
                             f"source provides: {have}")
        if callable(art):
            art = art()
            self.artefacts[fmt] = art
        return art


Resolver = Callable[[str, str | None], ResolvedModel | None]
RESOLVERS: list[tuple[str, Resolver]] = []


def register(name: str, first: bool = False) -> Callable[[Resolver], Resolver]:
    """`first`: a resolver of a `scheme:` prefix, tried before the ones that look at paths
    (whatever order the modules were imported in), so `ollama:x.gguf` is never a file."""
    def deco(fn: Resolver) -> Resolver:
        if first:
            RESOLVERS.insert(0, (name, fn))
        else:
            RESOLVERS.append((name, fn))
        return fn

    return deco


def resolve(ref: str, model_name: str | None = None) -> ResolvedModel:
    """First resolver that recognises `ref` wins; InputError when none does."""
    from strata.models import endpoint, gguf, hf, ollama, synthetic  # noqa: F401  (registration)

    for _name, resolver in RESOLVERS:
        model = resolver(ref, model_name)
        if model is not None:
            return model
    if not Path(ref).exists():
        raise InputError(f"MODEL {ref}: no such file or directory (expected a .gguf file, a "
                         "Hugging Face model directory, synthetic:<preset>, ollama:NAME[:TAG] "
                         "or http://host:port)")
    raise InputError(f"MODEL {ref}: unknown model format (expected a .gguf file, a directory "
                     "with config.json, synthetic:<preset>, ollama:NAME[:TAG] or "
                     "http://host:port)")
