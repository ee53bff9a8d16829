"""Skills: a teacher's know-how for writing kernels in one dialect, handed to a student model
as extra prompt text and judged by execution (`strata skills eval`), never by reading.

A skill is a folder with `SKILL.md` (the text the student gets) and `skill.json` (who wrote
it, when, on which host, from which train ops and sources). `builtin:<dialect>` names the
skills shipped with strata, written from the lab's own built-in kernels and measurements,
so `--skill builtin:c` works offline. A skill's hash covers its text and its metadata: two
attempts that name the same hash saw the same skill.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.errors import InputError

BUILTIN = Path(__file__).parent / "builtin"
SKILL_FILE, META_FILE = "SKILL.md", "skill.json"


@dataclass(frozen=True)
class Skill:
    name: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False)
    hash: str = ""

    @property
    def ref(self) -> str:
        """How an Attempt names it: name@hash."""
        return f"{self.name}@{self.hash}"


def skill_hash(text: str, meta: dict[str, Any]) -> str:
    body = text.encode() + b"\0" + json.dumps(meta, sort_keys=True).encode()
    return hashlib.sha256(body).hexdigest()[:16]


def builtin_dialects() -> list[str]:
    return sorted(p.name for p in BUILTIN.iterdir() if (p / SKILL_FILE).is_file())


def _folder(ref: str | Path, flag: str) -> Path:
    text = str(ref)
    if text.startswith("builtin:"):
        dialect = text.split(":", 1)[1]
        if dialect not in builtin_dialects():
            raise InputError(f"{flag} {text}: no built-in skill for dialect {dialect!r} "
                             f"(built-in: {', '.join(f'builtin:{d}' for d in builtin_dialects())})")
        return BUILTIN / dialect
    path = Path(text).expanduser()
    if path.is_file() and path.name == SKILL_FILE:
        return path.parent
    if not path.is_dir():
        raise InputError(f"{flag} {text}: not found (give a folder holding {SKILL_FILE} and "
                         f"{META_FILE}, or builtin:<dialect>)")
    return path


def _meta(folder: Path, ref: str, flag: str) -> dict[str, Any]:
    path = folder / META_FILE
    if not path.is_file():  # a hand-written skill may be just its text
        return {}
    try:
        meta = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{flag} {ref}: {META_FILE} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise InputError(f"{flag} {ref}: {META_FILE} must hold a JSON object")
    return meta


def load_skill(ref: str | Path, flag: str = "--skill") -> Skill:
    """A skill from a folder (SKILL.md + skill.json) or `builtin:<dialect>`; InputError (one
    line, naming `flag`: how the user gave it) when the folder, its SKILL.md or its metadata
    is missing or unreadable."""
    folder = _folder(ref, flag)
    text_path = folder / SKILL_FILE
    if not text_path.is_file():
        raise InputError(f"{flag} {ref}: {folder} has no {SKILL_FILE} (a skill is a folder "
                         f"with {SKILL_FILE} and {META_FILE})")
    try:
        text = text_path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{flag} {ref}: cannot read {SKILL_FILE} ({exc})") from None
    if not text.strip():
        raise InputError(f"{flag} {ref}: {SKILL_FILE} is empty")
    meta = _meta(folder, str(ref), flag)
    name = str(meta.get("name") or folder.name)
    return Skill(name, text, meta, skill_hash(text, meta))


def write_skill_folder(dest: Path, name: str, text: str, meta: dict[str, Any]) -> Skill:
    """Write SKILL.md and skill.json (meta with its name) into `dest`; the skill as loaded."""
    if not text.strip():
        raise InputError(f"skill {name}: the text is empty, nothing to write")
    if dest.exists() and not dest.is_dir():
        raise InputError(f"skill folder {dest}: exists and is not a folder")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / SKILL_FILE).write_text(text.rstrip() + "\n", "utf-8")
    full = {**meta, "name": name}
    (dest / META_FILE).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n", "utf-8")
    return load_skill(dest)


__all__ = ["BUILTIN", "Skill", "builtin_dialects", "load_skill", "skill_hash",
           "write_skill_folder"]
