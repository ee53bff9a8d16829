"""Transformer architectures, each declared once (docs/architecture.md §11.6).

An architecture is one file here that registers an `Arch`: which GGUF tensors a layer holds
and what role each plays, where the norms sit, the attention variant, the RoPE variant, the
MLP variant and the embedding scale. The one executor (`strata.engine`) runs any registered
architecture over any layer range with any ops backend — `-B lab` (every layer, lab
kernels), a ring stage (its layers, lab or torch ops) — so a new architecture is written
once, not once per executor.

    from strata.models import arch
    a = arch.get("qwen2")             # KeyError-free: InputError naming the known ones
    arch.names()                      # ['llama', 'qwen2', 'qwen3', 'qwen3moe', ...]

Architectures outside the package load from the folders named in STRATA_ARCH_PATH (each
`*.py` there registers its own, as the built-in files do): a user adds a model family
without editing strata.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
from pathlib import Path

from strata.errors import InputError
from strata.models.arch.spec import (
    GLOBAL_TENSORS,
    MLP_KINDS,
    ROPE_KINDS,
    Arch,
    LayerTensor,
)

ARCH_PATH_ENV = "STRATA_ARCH_PATH"

_REGISTRY: dict[str, Arch] = {}
_LOADED: set[str] = set()  # plugin files already executed (by resolved path)
_BUILTINS_LOADED = False


def register(arch: Arch) -> Arch:
    """Add `arch` under its GGUF name (a later file may not silently replace another's)."""
    old = _REGISTRY.get(arch.name)
    if old is not None and old != arch:
        raise ValueError(f"architecture {arch.name!r} is registered twice")
    _REGISTRY[arch.name] = arch
    return arch


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    for info in pkgutil.iter_modules(__path__):
        if info.name != "spec":
            importlib.import_module(f"{__name__}.{info.name}")


def load_folder(folder: Path) -> list[str]:
    """Execute every `*.py` of `folder` (each registers its architectures); the names added.
    InputError when a file does not import — one line naming it."""
    before = set(_REGISTRY)
    for path in sorted(Path(folder).glob("*.py")):
        key = str(path.resolve())
        if key in _LOADED:
            continue
        _LOADED.add(key)
        spec = importlib.util.spec_from_file_location(f"strata_arch_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # a user's file: say which and why, in one line
            raise InputError(f"{ARCH_PATH_ENV}: {path} does not load: "
                             f"{type(exc).__name__}: {exc}") from None
    return sorted(set(_REGISTRY) - before)


def _load_plugins() -> None:
    for folder in filter(None, os.environ.get(ARCH_PATH_ENV, "").split(os.pathsep)):
        if Path(folder).is_dir():
            load_folder(Path(folder))


def names() -> list[str]:
    """Every architecture strata's executor runs (built-in and STRATA_ARCH_PATH's)."""
    _load_builtins()
    _load_plugins()
    return sorted(_REGISTRY)


def find(name: object) -> Arch | None:
    _load_builtins()
    if isinstance(name, str) and name not in _REGISTRY:
        _load_plugins()
    return _REGISTRY.get(name) if isinstance(name, str) else None


def get(name: object, where: str = "strata's engine") -> Arch:
    """The architecture `name`; InputError naming the ones that exist."""
    arch = find(name)
    if arch is None:
        raise InputError(f"{where} runs the {', '.join(names())} architectures, not {name}: "
                         "llama.cpp runs GGUF files of many more (--backend llamacpp), or "
                         "declare it (docs/architecture.md §11.6)")
    return arch


__all__ = ["ARCH_PATH_ENV", "GLOBAL_TENSORS", "MLP_KINDS", "ROPE_KINDS", "Arch",
           "LayerTensor", "find", "get", "load_folder", "names", "register"]
