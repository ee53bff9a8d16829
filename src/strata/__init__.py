"""strata: what will run on this machine, how fast, and why.

The command line (`strata --help`) and the same questions from Python:

    from strata import api
    api.probe()                     # this host's profile (CPU, GPUs, software, verdicts)
    api.bench("model.gguf", backend="llamacpp", n_prompt=64, n_gen=16, reps=1)
    api.fit("model.gguf", ctx=32768)
    api.quality("model-q4_0.gguf", ref="model-f16.gguf")
    api.whatif("model.gguf", on=["rtx-4090", "m4-max-40c"])
    import strata
    strata.kernels.implementations()  # the kernel lab: list, verify, add, remove, get
    strata.lab.load("model.gguf")     # a GGUF on the lab's own kernels

Results render as tables in Jupyter and convert with `.to_pandas()` / `.to_records()`;
errors raise `strata.InputError` naming the parameter. The functions live in strata/api.py
(their docstrings say what they take and return);
`strata.bench`, `strata.fit` and `strata.quality` are the packages that implement them.
Everything loads on first use: `import strata` imports neither torch nor llama.cpp.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from strata import api, kernels, lab

_LAZY = ("api", "kernels", "lab")

__all__ = ["InputError", "StrataError", "__version__", "api", "kernels", "lab"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return import_module(f"strata.{name}")
    if name in ("InputError", "StrataError"):  # what the API raises, to catch by name
        return getattr(import_module("strata.errors"), name)
    raise AttributeError(f"module 'strata' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API only (not this module's own imports: Any, import_module, …)."""
    return sorted(__all__)
