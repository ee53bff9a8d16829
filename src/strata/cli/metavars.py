"""Help placeholders that say what to type: `N`, `FILE`, `TYPE` — never a Python type.

typer (≥ 0.2x) shows an option's type in help as `<str>`, `<bool>`, `<list[str]>`, and a
required argument in the usage line as `{MODEL}`. A llama-bench or git user expects the
value's meaning (`-p N[,N…]`), nothing after a flag, and `MODEL` / `[MODEL]` in the usage
line. `install()` replaces those renderers once, for every command: an explicit metavar
wins; a flag shows none; otherwise the placeholder comes from the type (int: N, float: NUM,
path: PATH) or from the option's own long name (`--kv-type` → TYPE).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BY_TYPE = {"int": "N", "float": "NUM", "path": "PATH", "file": "FILE"}


def _from_name(param: Any) -> str:
    longs = [o for o in param.opts if o.startswith("--")]
    word = (longs[0] if longs else param.opts[0]).lstrip("-").split("-")[-1]
    return word.upper() or "VALUE"


def option_metavar(param: Any, ctx: Any) -> str | None:
    """What the help's value column shows for an option (None: nothing, a flag)."""
    if param.metavar is not None:
        return param.metavar
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    desc = getattr(param, "type_descriptor", None)
    if desc is not None and getattr(desc, "is_choice", False):  # its values say it
        return "|".join(map(str, desc.choices or ()))
    if desc is not None and getattr(desc, "is_path", False):
        return "PATH"
    annotation = getattr(desc, "annotation", None)
    name = getattr(annotation, "__name__", "")
    if annotation is Path:
        return "PATH"
    return BY_TYPE.get(name) or _from_name(param)


def install() -> None:
    """Patch typer's help renderers (idempotent; a typer without them is left as is)."""
    from typer import core

    option, argument = getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)
    if option is not None and hasattr(option, "display_type_rich"):
        option.display_type_rich = option_metavar  # type: ignore[method-assign]
    if argument is None:
        return
    if hasattr(argument, "display_type_rich"):  # the argument's name already says it
        argument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]
    if hasattr(argument, "_usage_display_name"):
        argument._usage_display_name = _usage_name  # type: ignore[method-assign]


def _usage_name(self: Any) -> str:
    """`MODEL` when required, `[MODEL]` when not, `...` when it repeats (click's way)."""
    name = self.display_name_raw
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 and not name.endswith("...") else "")
