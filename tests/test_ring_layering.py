"""The ring's import graph (docs/architecture.md §7, "A ring of machines"): strata.ring.plan
(the partition), strata.ring.runtime (a stage's data plane) and strata.ring.control (the
daemons) import one another one way only, and no strata.ring module imports one that
imports it back. Read from the AST: imports at the top, under `if TYPE_CHECKING:` and inside
functions all count (a lazy import hides a cycle; it does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import strata.ring

RING = Path(strata.ring.__file__).parent
PREFIX = "strata.ring"
# Which sub-package may import which: plan is pure planning, runtime runs a stage, control
# (the daemons, the leader) uses both.
MAY_IMPORT = {"plan": {"plan"}, "runtime": {"runtime"},
              "control": {"control", "plan", "runtime"}}


def _modules(root: Path = RING, prefix: str = PREFIX) -> dict[str, Path]:
    """strata.ring.* module name -> its file (a package by its __init__.py)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([prefix, *parts])] = path
    return out


def _resolve(module: str, names: list[str], known: set[str]) -> set[str]:
    """The strata.ring modules an import statement loads: `from P import x` is P.x when that
    is a module, else P itself."""
    if module not in known and not module.startswith(PREFIX + "."):
        return set()
    targets = {f"{module}.{n}" for n in names if f"{module}.{n}" in known}
    if len(targets) < len(names) and module in known:
        targets.add(module)
    while module not in known and "." in module:  # a name under a module: the module
        module = module.rsplit(".", 1)[0]
        if module in known:
            targets.add(module)
    return targets


def imports_of(name: str, source: str, known: set[str], is_package: bool = False) -> set[str]:
    """Every strata.ring module that `source` (module `name`) imports, anywhere in it."""
    package = name if is_package else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found |= _resolve(alias.name, [], known) | (
                    {alias.name} if alias.name in known else set())
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found |= _resolve(base, [a.name for a in node.names], known)
    found.discard(name)
    return found


def graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    modules = modules if modules is not None else _modules()
    known = set(modules)
    return {name: imports_of(name, path.read_text(encoding="utf-8"), known,
                             path.name == "__init__.py")
            for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize(("sources", "cyclic"), [
    ({"a": "from strata.ring.b import x", "b": "def f():\n    from strata.ring import a"},
     True),  # a function-level import closes the cycle
    ({"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import strata.ring.b",
      "b": "from strata.ring.a import y"}, True),
    ({"a": "from . import b", "b": "from .a import y"}, True),  # relative imports
    ({"a": "from strata.ring.b import x", "b": "import json"}, False),
])
def test_the_checker_sees_every_form(tmp_path: Path, sources: dict[str, str],
                                     cyclic: bool) -> None:
    (tmp_path / "__init__.py").write_text("")
    for name, text in sources.items():
        (tmp_path / f"{name}.py").write_text(text)
    assert bool(cycles(graph(_modules(tmp_path)))) is cyclic


def test_the_ring_has_no_import_cycle() -> None:
    edges = graph()
    assert "strata.ring.control.runner" in edges and "strata.ring.plan.partition" in edges
    assert cycles(edges) == []


def test_plan_runtime_control_import_one_way() -> None:
    offenders = []
    for name, targets in graph().items():
        parts = name.split(".")
        if len(parts) < 4:  # strata.ring itself
            continue
        for target in targets:
            sub = target.split(".")[2] if target.count(".") >= 2 else ""
            if sub and sub not in MAY_IMPORT[parts[2]]:
                offenders.append(f"{name} -> {target}")
    assert offenders == []


def test_every_ring_module_is_in_a_sub_package() -> None:
    """ring/ holds plan/, runtime/ and control/ only (the tree shows the architecture)."""
    loose = sorted(n for n, path in _modules().items()
                   if n.count(".") == 2 and path.name != "__init__.py")
    assert loose == [], loose
