"""docs/architecture.md §1: nothing below commands/ imports a command. The domain packages
that once reached up into strata.commands (the kernel lab, -B lab, training, rank, the ring,
bench) are checked by reading their source: every import, at any depth in a module
(function-local ones too), must stay clear of strata.commands."""

from __future__ import annotations

import ast
from pathlib import Path

import strata

SRC = Path(strata.__file__).parent
BELOW_COMMANDS = ("kernels", "lab", "train", "rank", "ring", "bench")
FORBIDDEN = "strata.commands"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement reaches (relative ones made absolute)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    # `from strata import commands` names the package through its alias
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _names_commands(name: str) -> bool:
    return name == FORBIDDEN or name.startswith(FORBIDDEN + ".")


def test_no_domain_module_imports_a_command() -> None:
    offenders = []
    files = [p for pkg in BELOW_COMMANDS for p in sorted((SRC / pkg).rglob("*.py"))]
    assert len(files) > 50, "the walk found too few modules: is SRC right?"
    for path in files:
        module = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for name in _imported(node, module, path.name == "__init__.py"):
                if _names_commands(name):
                    offenders.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: {name}")
    assert not offenders, "imports of strata.commands below commands/:\n" + \
        "\n".join(offenders)


def test_the_relative_import_check_sees_a_command() -> None:
    """The walk above would catch `from ..commands import kernels` as well."""
    node = ast.parse("from ..commands import kernels").body[0]
    assert any(_names_commands(n) for n in _imported(node, "strata.rank.ranking", False))
    node = ast.parse("from strata import commands").body[0]
    assert any(_names_commands(n) for n in _imported(node, "strata.bench.sweep", False))


def test_emit_lives_in_views() -> None:
    """`emit` (print a command's answer in the format asked for) is a printer: views/."""
    from strata.views import output

    assert callable(output.emit) and output.emit.__module__ == "strata.views.output"
    tree = ast.parse((SRC / "cli" / "output.py").read_text(encoding="utf-8"))
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "emit" not in defined, "cli/output.py defines emit again: it belongs to views/"


# CLI modules that parse flags, call one use case in commands/ and print through views/:
# nothing of the domain below (the generator, the skills, the store, the host) is theirs.
THIN_CLI = ("kernels_gen", "skills")
THIN_CLI_MAY_IMPORT = ("strata.cli", "strata.commands", "strata.views", "strata.errors")


def test_thin_cli_modules_leave_the_use_case_to_commands() -> None:
    offenders = []
    for name in THIN_CLI:
        path = SRC / "cli" / f"{name}.py"
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            for imported in _imported(node, module, False):
                inside = imported == "strata" or imported.startswith("strata.")
                if inside and not any(imported == allowed or imported.startswith(allowed + ".")
                                      for allowed in THIN_CLI_MAY_IMPORT):
                    offenders.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: {imported}")
    assert not offenders, "domain imports in a thin CLI module (move the orchestration to " \
        "commands/):\n" + "\n".join(offenders)
