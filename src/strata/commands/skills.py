"""`strata skills list | write | eval`: the use cases. A teacher model writes a skill from
the lab's verified built-ins (kernels/skills/teach.py); a student model is measured with and
without it on held-out ops (kernels/skills/ab.py). The CLI (cli/skills.py) parses and checks
the flags, calls one of these and prints what it returns (views/kernels_gen.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from strata.commands.kernels import default_jobs, probed_session
from strata.commands.kernels_gen import ModelServer, Progress, target_device

if TYPE_CHECKING:
    from strata.kernels.skills import Skill


def _ops(text: str | None) -> list[str] | None:
    if text is None:
        return None
    from strata.kernels.gen.evaluate import resolve_ops

    return resolve_ops(text, "")


def builtin_skills() -> list[tuple[str, Skill]]:
    """The built-in skills, one per dialect, each with its --skill reference."""
    from strata.kernels.skills import builtin_dialects, load_skill

    return [(f"builtin:{d}", load_skill(f"builtin:{d}")) for d in builtin_dialects()]


# -- write ---------------------------------------------------------------------------------

@dataclass
class WriteOptions:
    """`strata skills write`'s flags."""

    teacher: ModelServer
    dest: Path
    teacher_model: str | None = None
    dialect: str = "c"
    device: str | None = None
    train_ops: str = "rmsnorm,softmax,matmul"
    name: str | None = None
    max_tokens: int | None = None
    db: Path | None = None


def write(o: WriteOptions, err: Console, progress: Progress) -> Skill:
    """The teacher writes the skill into o.dest from the built-ins of the train ops (their
    speed measured on this host's roofline), under `progress(title)`."""
    from strata.kernels.skills.teach import write_skill

    ops = _ops(o.train_ops) or []
    s = probed_session(o.db, err)
    target = target_device(s, o.dialect, o.device)
    roof = s.host.roofline(err)
    with o.teacher.client(err) as client:
        model = client.resolve_model(o.teacher_model)
        with progress(f"{model} writing the skill…"):
            return write_skill(client, model, s, dialect=o.dialect, device=target,
                               roofline=roof, train_ops=ops, dest=o.dest,
                               name=o.name or o.dest.name, max_tokens=o.max_tokens)


# -- eval ----------------------------------------------------------------------------------

@dataclass
class EvalOptions:
    """`strata skills eval`'s flags."""

    skill: str
    student: ModelServer
    student_model: str | None = None
    ops: str | None = None
    dialect: str | None = None
    device: str | None = None
    samples: int = 4
    turns: int = 4
    temperature: float = 0.7
    bench: bool = True
    timeout_s: float = 120.0
    db: Path | None = None


@dataclass
class SkillEval:
    """A skill measured on a student: the skill, the student's model, the held-out ops and
    the A/B (kernels.skills.ab.ABResult)."""

    skill: Skill
    model: str
    ops: list[str]
    result: Any


def evaluate(o: EvalOptions, err: Console, progress: Progress) -> SkillEval:
    """The student writes the held-out ops without and with the skill (same samples, turns
    and seeds), under `progress("A/B…")`, whose callback takes a message."""
    from strata.kernels.gen.evaluate import EvalConfig
    from strata.kernels.skills import load_skill
    from strata.kernels.skills.ab import held_out, run_ab

    chosen = load_skill(o.skill, "SKILL")
    dialect = o.dialect or str(chosen.meta.get("dialect") or "c")
    op_list = held_out(chosen, _ops(o.ops))
    s = probed_session(o.db, err)
    target = target_device(s, dialect, o.device)
    roof = s.host.roofline(err) if o.bench else None
    with o.student.client(err) as client:
        model = client.resolve_model(o.student_model)
        base = EvalConfig(models=[model], ops=op_list, dialect=dialect, device=target,
                          samples=o.samples, turns=o.turns, temperature=o.temperature,
                          bench=o.bench, timeout_s=o.timeout_s, jobs=default_jobs())
        with progress("A/B…") as say:
            result = run_ab(base, chosen, client, s.conn, roof, say)
    return SkillEval(chosen, model, op_list, result)
