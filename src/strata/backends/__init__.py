"""Backend registry: every module in strata.backends.descriptors declares one DESCRIPTOR.

Adding a backend is one implementation file plus one descriptor file; the lists every other
part of strata uses (names, accepted model forms, fit rules, quality scorers, CLI help, the
device a load runs on) are derived from the descriptors here. Implementations are imported
only when created, so heavy dependencies stay lazy.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

from strata.backends.base import Backend, BackendDescriptor, BackendUnavailable

DESCRIPTORS_PACKAGE = "strata.backends.descriptors"


@functools.cache
def registry() -> dict[str, BackendDescriptor]:
    """name -> descriptor, in `order`; found by scanning the descriptors package's path."""
    package = importlib.import_module(DESCRIPTORS_PACKAGE)
    found: dict[str, BackendDescriptor] = {}
    for info in pkgutil.iter_modules(package.__path__):
        desc = getattr(importlib.import_module(f"{DESCRIPTORS_PACKAGE}.{info.name}"),
                       "DESCRIPTOR", None)
        if not isinstance(desc, BackendDescriptor):
            continue
        if desc.name in found:  # two files claiming one name would make lookups order-dependent
            raise ValueError(f"backend {desc.name} is declared twice ({info.name})")
        found[desc.name] = desc
    return dict(sorted(found.items(), key=lambda kv: (kv[1].order, kv[0])))


def describe(name: str) -> BackendDescriptor:
    desc = registry().get(name)
    if desc is None:
        from strata.errors import InputError

        raise InputError(f"--backend {name}: unknown backend (choose from "
                         f"{', '.join(registry())})")
    return desc


def names(*, fit: bool = False, scoring: bool = False) -> tuple[str, ...]:
    """Backend names, optionally only those with fit rules / a quality scorer."""
    return tuple(n for n, d in registry().items()
                 if (not fit or d.fit is not None) and (not scoring or d.scoring is not None))


def __getattr__(attr: str) -> Any:
    # BACKENDS (name -> "module:factory") and ACCEPTS (name -> model forms) stay importable
    # under their old names, computed from the descriptors at each access.
    if attr == "BACKENDS":
        return {n: d.factory for n, d in registry().items()}
    if attr == "ACCEPTS":
        return {n: d.accepts for n, d in registry().items()}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def create(name: str) -> Backend:
    """Instantiate a backend; BackendUnavailable (with the reason) if its extra is missing."""
    module, _, factory = describe(name).factory.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailable(f"{name}: {exc} (install the extra: pip install "
                                 f"'strata[{name}]')") from exc
    make: Callable[[], Backend] = getattr(mod, factory)
    return make()
