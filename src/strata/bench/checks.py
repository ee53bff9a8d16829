"""Checks before work: every (model, backend) pair and every test is validated before the
first measurement, so a sweep never benches one model for minutes and then fails on the
next one's architecture, storage type or context.

- A pair a backend cannot take (another model form, an architecture or a storage type it
  has no code for) is skipped with the reason, before the host's roofline and before any
  test; the others run, and the skips are listed (exit 0 when anything ran).
- A test that needs more context than the model holds (depth + prompt + generated tokens
  past its trained context) is refused before anything runs, naming the test: llama.cpp
  and torch would run it past the model's positions, or fail half way through the sweep.
"""

from __future__ import annotations

from strata.backends import ACCEPTS, describe
from strata.bench.plan import BenchConfig
from strata.errors import InputError
from strata.models.source import ResolvedModel

_KINDS = {"hf": "a Hugging Face directory", "gguf": "a GGUF file",
          "endpoint": "an endpoint (a server)"}


def incompatible(model: ResolvedModel, backend: str) -> str | None:
    """Why `backend` cannot take `model`, or None: its form first, then what the backend's
    descriptor checks (architecture, storage types) without loading anything."""
    accepts = ACCEPTS.get(backend, ())
    # a model a server runs (an endpoint, ollama:NAME) is an endpoint besides its files
    have = tuple(model.artefacts) + (("endpoint",) if model.endpoint else ())
    if not set(accepts) & set(have):
        others = [name for name, forms in ACCEPTS.items() if set(forms) & set(have)]
        hint = f" (-B {','.join(others)} can run it)" if others else ""
        kind = _KINDS.get(model.kind, f"a {model.kind} model")
        return (f"the {backend} backend needs a {' or '.join(accepts)} model; "
                f"{model.ref} is {kind}{hint}")
    check = describe(backend).check
    return check(model) if check is not None else None


def refused_pairs(config: BenchConfig, models: dict[str, ResolvedModel]
                  ) -> dict[tuple[str, str], str]:
    """(model, backend) -> why it is skipped, for every pair of the sweep."""
    out = {}
    for m in config.models:
        for b in config.backends:
            why = incompatible(models[m], b)
            if why:
                out[(m, b)] = why
    return out


def check_contexts(config: BenchConfig, models: dict[str, ResolvedModel]) -> None:
    """A test past a model's trained context is refused before anything runs."""
    for ref in config.models:
        spec = models[ref].spec
        limit = getattr(spec, "ctx_max", 0) if spec is not None else 0
        if not limit:
            continue
        for t in config.tests:
            need = t.depth + t.n_prompt + t.n_gen
            if need > limit:
                raise InputError(f"{t.name} needs {need:,} tokens of context but {ref} holds "
                                 f"{limit:,} (its trained context): use a smaller -d, -p or "
                                 "-n for this model")
