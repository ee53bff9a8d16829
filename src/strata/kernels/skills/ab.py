"""`strata skills eval`: the student writes kernels for held-out ops with and without the
skill — same ops, samples, turns and per-turn seeds in both arms — and the lift is measured
by execution (strata.kernels.gen.metrics.skills_ab: paired bootstrap CI, token ratio,
verdict)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from strata.errors import InputError
from strata.kernels.gen.evaluate import EvalConfig, run_eval
from strata.kernels.gen.records import Attempt
from strata.kernels.skills import Skill


@dataclass
class ABResult:
    ab: Any  # metrics.SkillAB
    without: list[Attempt]
    with_skill: list[Attempt]
    ops: list[str]


def held_out(skill: Skill, ops: list[str] | None) -> list[str]:
    """The ops the teacher never saw: all lab ops minus the skill's train ops, or the given
    ones (refused if the teacher saw any of them)."""
    from strata.kernels.spec import all_specs

    train = set(skill.meta.get("train_ops") or [])
    if ops is None:
        chosen = [o for o in all_specs() if o not in train]
        if not chosen:
            raise InputError(f"skill {skill.name}: trained on every op; nothing is held out")
        return chosen
    seen = [o for o in ops if o in train]
    if seen:
        raise InputError(f"--ops: {', '.join(seen)} taught by skill {skill.name} (its train "
                         f"ops: {', '.join(sorted(train))}); evaluate on held-out ops")
    return ops


def run_ab(base: EvalConfig, skill: Skill, client: Any, conn: Any, roofline: Any,
           say: Any = lambda m: None) -> ABResult:
    """Both arms on the same config; only the skill differs (and the run ids)."""
    from strata.kernels.gen.metrics import skills_ab

    tag = uuid.uuid4().hex[:8]
    arms = {}
    for label, chosen in (("without", None), ("with", skill)):
        cfg = EvalConfig(**{**base.__dict__, "skill": chosen, "run": f"ab-{tag}-{label}"})
        arms[label] = run_eval(cfg, client, conn, roofline,
                               lambda m, lab=label: say(f"[{lab} skill] {m}"))
    ab = skills_ab(arms["with"], arms["without"])
    return ABResult(ab, arms["without"], arms["with"], base.ops)
