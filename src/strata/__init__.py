"""strata: what will run on this machine, how fast, and why.

The command line (`strata --help`) and the same questions from Python:

    import strata
    strata.probe()                  # this host's profile (CPU, GPUs, software, verdicts)
    strata.bench("model.gguf", backend="llamacpp", n_prompt=64, n_gen=16, reps=1)
    strata.fit("model.gguf", ctx=32768)
    strata.quality("model-q4_0.gguf", ref="model-f16.gguf")
    strata.kernels.implementations()  # the kernel lab: list, verify, add, remove, get
    strata.lab.load("model.gguf")     # a GGUF on the lab's own kernels

The functions live in strata/api.py (their docstrings say what they take and return).
`strata.bench`, `strata.fit` and `strata.quality` are also the packages that implement
them (`strata.fit.fit_model`, `strata.bench.plan`, ...): calling the package calls the
function. Everything loads on first use: `import strata` imports neither torch nor
llama.cpp.
"""

from __future__ import annotations

import inspect
import sys
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from strata import kernels, lab
    from strata.api import bench, fit, probe, quality

_FUNCTIONS = ("bench", "fit", "probe", "quality")  # strata/api.py
_CALLABLE_PACKAGES = ("bench", "fit", "quality")  # packages of the same name
_PACKAGES = ("kernels", "lab")

__all__ = ["__version__", "bench", "fit", "kernels", "lab", "probe", "quality"]


def _api(name: str) -> Any:
    return getattr(import_module("strata.api"), name)


def _make_callable(package: ModuleType, name: str) -> None:
    """`strata.fit(...)` calls strata.api.fit while `strata.fit` stays the package that
    Python's import system binds to that name (`strata.fit.fit_model` keeps working)."""
    if callable(package):
        return
    fn = _api(name)

    def __call__(self: ModuleType, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    __call__.__doc__ = fn.__doc__
    package.__class__ = type(f"{name}_package", (ModuleType,), {"__call__": __call__})
    package.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]


class _Strata(ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # importing strata.bench (strata.fit, strata.quality) binds the package here
        if name in _CALLABLE_PACKAGES and isinstance(value, ModuleType):
            _make_callable(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Strata
for _name in _CALLABLE_PACKAGES:  # packages imported before this line ran (none normally)
    if f"{__name__}.{_name}" in sys.modules:
        _make_callable(sys.modules[f"{__name__}.{_name}"], _name)


def __getattr__(name: str) -> Any:
    if name in _CALLABLE_PACKAGES or name in _PACKAGES:
        return import_module(f"strata.{name}")  # binds it (callable, for the former)
    if name in _FUNCTIONS:
        return _api(name)
    raise AttributeError(f"module 'strata' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
