"""What each backend does with a model's memory: the types of a backend's fit rules.

The rules themselves live with each backend (its descriptor's `fit`, strata.backends.
descriptors): which form of the model it reads, in which dtype it holds the weights and K/V
on each device kind, whether a GPU can hold part of the layers (llama.cpp's -ngl), and the
memory rules per device kind (strata.fit.memory). BACKENDS is derived from the registry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strata.errors import InputError
from strata.fit.memory import DeviceRules, Shape
from strata.fit.weights import QuantSpec
from strata.hardware.profile import HostProfile
from strata.models.source import ResolvedModel
from strata.models.spec import ModelSpec

DEVICE_KINDS = ("cpu", "gpu")


@dataclass
class Runtime:
    """The model as a backend holds it on one device kind."""

    spec: ModelSpec
    kv_type: str  # element type of the K/V cache
    runtime_dtype: str | None  # dtype the weights are converted to (None: as stored)
    notes: list[str] = field(default_factory=list)


RuntimeFor = Callable[[ResolvedModel, HostProfile, str, str | None], Runtime]
QuantFor = Callable[[ResolvedModel, Runtime, str], QuantSpec]


@dataclass
class FitSection:
    """A backend's own part of the fit answer, printed after the plan (lab: the kernel that
    would serve each op of the model on one device): a table and lines; `data` for --json."""

    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]]
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, **self.data}


# (model, the host: results DB, fingerprint and the kernel lab's HostCaps, the K/V type) ->
# sections; called by the fit command, which holds the host (typed loosely: fit does not import the
# kernel lab)
SectionsFor = Callable[[ResolvedModel, Any, str], list[FitSection]]


@dataclass(frozen=True)
class BackendRules:
    name: str
    kv_types: tuple[str, ...]  # accepted --kv-type values; () = K/V in the model's dtype
    quants: tuple[str, ...]  # weight storage choices the backend runs
    layer_split: bool  # a GPU can hold some of the layers (llama.cpp -ngl)
    devices: dict[str, DeviceRules]  # device kind -> memory rules
    runtime: RuntimeFor
    quant: QuantFor
    sections: SectionsFor | None = None  # what else the answer says for this backend
    moe: bool = True  # runs mixture-of-experts models (routed experts)
    # KV cells a sliding-window layer holds at (spec, shape, --swa-full); None: the full
    # context (a backend that keeps every position, or says nothing finer)
    window_cells: Callable[[ModelSpec, Shape, bool], int | None] | None = None


@functools.cache
def fit_rules() -> dict[str, BackendRules]:
    """name -> rules, for every registered backend that declares fit rules (built once)."""
    from strata.backends import registry

    return {name: d.fit() for name, d in registry().items() if d.fit is not None}


def __getattr__(attr: str) -> Any:
    # BACKENDS is read lazily: the registry's descriptors import this module for its types
    if attr == "BACKENDS":
        return fit_rules()
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def backend_rules(name: str) -> BackendRules:
    rules = fit_rules().get(name)
    if rules is None:
        raise InputError(f"--backend {name}: fit plans for {', '.join(fit_rules())}")
    return rules
