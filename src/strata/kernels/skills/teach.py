"""`strata skills write`: a teacher model studies the lab's verified built-ins for the train
ops (source, measured speed on this host, the hardware dialect) and writes a skill folder."""

from __future__ import annotations

import hashlib
import re
import string
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from strata.errors import InputError
from strata.kernels.skills import Skill, write_skill_folder

TEACHER_TEMPLATE = Path(__file__).parent / "teacher.md"
MAX_SOURCE_CHARS = 12_000  # per kernel: a teacher's context is finite
_WHOLE_FENCE = re.compile(r"^\s*```[a-zA-Z]*\n(.*)\n```\s*$", re.S)


@dataclass
class Lesson:
    """One built-in the teacher is shown."""

    key: str
    source: str
    content_hash: str
    speedup: float | None  # geomean over torch eager at the llm shapes, if benchmarked here
    verified: bool


def lessons(s: Any, ops: list[str], dialect: str, device: str) -> list[Lesson]:
    """The built-ins of `dialect` for `ops` that run here, with what this host measured."""
    from strata.kernels.dispatch import speed_of
    from strata.kernels.impl import builtin_implementations
    from strata.store.kernels import latest_bench, latest_verification

    found = []
    for impl in builtin_implementations():
        if impl.op not in ops or impl.dialect != dialect or impl.requires.check(s.caps):
            continue
        h = impl.content_hash()
        stored = latest_verification(s.conn, s.fingerprint, impl.op, impl.name, h, device)
        speed = speed_of(latest_bench(s.conn, s.fingerprint, impl.op, impl.name, h, device))
        assert impl.source is not None
        found.append(Lesson(impl.key, impl.source.read_text("utf-8")[:MAX_SOURCE_CHARS], h,
                            None if speed.problem else speed.geomean,
                            stored is not None and stored.status == "pass"))
    if not found:
        raise InputError(f"--train-ops {','.join(ops)}: no built-in {dialect} kernel of these "
                         "ops runs on this host (see `strata kernels list`)")
    return found


def _lesson_text(lesson: Lesson, fence: str) -> str:
    speed = f"{lesson.speedup:.2f}x torch eager" if lesson.speedup else "not benchmarked here"
    state = "verified" if lesson.verified else "not yet verified here"
    return f"### {lesson.key} ({state}; {speed})\n\n```{fence}\n{lesson.source}\n```\n"


def teacher_messages(s: Any, dialect: str, device: str, roofline: Any,
                     taught: list[Lesson]) -> tuple[list[dict[str, str]], str]:
    """The request to the teacher, and the hash of the template it came from."""
    from strata.kernels.gen.hardware import hardware_dialect
    from strata.kernels.gen.rules import FENCES, rules_text

    template = TEACHER_TEMPLATE.read_text("utf-8")
    text = string.Template(template).substitute(
        dialect=dialect, hardware=hardware_dialect(s.host, device, roofline),
        rules=rules_text(taught[0].key.split("/")[0], dialect, ""),
        kernels="\n".join(_lesson_text(x, FENCES[dialect]) for x in taught))
    digest = hashlib.sha256(template.encode()).hexdigest()[:16]
    return [{"role": "user", "content": text}], digest


def skill_text(reply: str, name: str, dialect: str) -> str:
    """The teacher's reply as SKILL.md: an outer code fence removed, front matter ensured."""
    text = reply.strip()
    whole = _WHOLE_FENCE.match(text)
    if whole:
        text = whole.group(1).strip()
    if not text:
        raise InputError("the teacher's reply is empty: nothing to write (try another "
                         "--teacher-model or a higher --max-tokens)")
    if not text.startswith("---"):
        text = (f"---\nname: {name}\ndescription: Writing fast, correct {dialect} kernels "
                f"for strata's lab (written by a teacher model)\n---\n\n{text}")
    return text


def write_skill(client: Any, model: str, s: Any, *, dialect: str, device: str,
                roofline: Any, train_ops: list[str], dest: Path, name: str,
                max_tokens: int | None = None) -> Skill:
    taught = lessons(s, train_ops, dialect, device)
    messages, template = teacher_messages(s, dialect, device, roofline, taught)
    reply = client.chat(model, messages, temperature=0.3, max_tokens=max_tokens)
    meta = {"teacher": client.endpoint, "teacher_model": model, "date": date.today().isoformat(),
            "fingerprint": s.fingerprint, "dialect": dialect, "device": device,
            "train_ops": train_ops, "template_hash": template,
            "sources": {x.key: x.content_hash for x in taught},
            "tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out}
    return write_skill_folder(dest, name, skill_text(reply.text, name, dialect), meta)
