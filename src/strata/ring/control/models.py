"""Which models a ring member serves: files under the directories it was started with.

A peer or a client names a model in every request that loads one (run, assign, time_layer,
a fleet bench's MODEL arguments). The name is never taken as a path to open: it is looked up
under this member's `--models` directories (a relative name in each, an absolute one only
if it lies inside one), after symbolic links and `..` are resolved, before anything is
opened. `synthetic:` presets are strata's own and always served; every other kind of
reference (an http:// endpoint a member would call, ollama:) is refused. So a peer that
names `../../etc/passwd` learns only that no such model is served here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from strata.errors import InputError

SYNTHETIC = "synthetic:"
MODEL_SUFFIXES = (".gguf",)
LIST_DEPTH = 3  # directory levels searched under each --models directory for /v1/models


@dataclass(frozen=True)
class ModelDirs:
    dirs: tuple[Path, ...]  # absolute, symbolic links resolved

    @classmethod
    def of(cls, dirs: list[Path] | None) -> ModelDirs:
        """The directories as given (default: the current one); each must exist."""
        chosen = dirs or [Path.cwd()]
        for d in chosen:
            if not Path(d).expanduser().is_dir():
                raise InputError(f"--models {d}: no such directory")
        return cls(tuple(Path(os.path.realpath(Path(d).expanduser())) for d in chosen))

    def ref(self, name: str) -> str:
        """The local reference for `name` (a path inside a model directory, or a synthetic
        preset), or one line saying it is not served here."""
        name = str(name)
        if name.startswith(SYNTHETIC):
            return name
        if "://" in name or name.startswith("ollama:") or "\0" in name:
            raise InputError(f"model {name!r}: this member serves files under its --models "
                             "directories and synthetic: presets only")
        given = Path(name)
        for candidate in [given] if given.is_absolute() else [d / given for d in self.dirs]:
            real = Path(os.path.realpath(candidate))
            if self._inside(real) and real.exists():
                return str(real)
        raise InputError(f"model {name!r} is not served here: no such file under "
                         f"{self.where()} (a member serves only what lies under the "
                         "directories `ring serve --models` names)")

    def _inside(self, real: Path) -> bool:
        return any(real == d or real.is_relative_to(d) for d in self.dirs)

    def where(self) -> str:
        return ", ".join(str(d) for d in self.dirs)

    def names(self) -> list[str]:
        """The GGUF files served, as names relative to their directory (what a client
        gives as `model`), sorted."""
        found: set[str] = set()
        for d in self.dirs:
            for path in _files(d, LIST_DEPTH):
                if path.suffix in MODEL_SUFFIXES and self._inside(Path(os.path.realpath(path))):
                    found.add(str(path.relative_to(d)))
        return sorted(found)


def _files(root: Path, depth: int) -> list[Path]:
    """Files under `root` down to `depth` levels (a models directory may be a whole disk:
    the listing stays bounded)."""
    out: list[Path] = []
    level = [root]
    for _ in range(depth):
        nxt: list[Path] = []
        for folder in level:
            try:
                entries = list(folder.iterdir())
            except OSError:
                continue
            out += [e for e in entries if e.is_file()]
            nxt += [e for e in entries if e.is_dir() and not e.name.startswith(".")]
        level = nxt
    return out
