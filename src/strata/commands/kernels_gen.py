"""`strata kernels generate | attempts | eval`: the use cases. Each opens the results DB and
probes the host, resolves the skill, the model and the device, builds the run's config and
calls the generator (kernels/gen/loop.py) or the evaluation (kernels/gen/evaluate.py). The
CLI (cli/kernels_gen.py) parses and checks the flags, calls one of these and prints what it
returns (views/kernels_gen.py). `strata skills` (commands/skills.py) shares the model server
and the device choice."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from strata.commands.kernels import Session, default_jobs, probed_session
from strata.errors import InputError

if TYPE_CHECKING:
    from strata.kernels.gen.chat import ChatClient
    from strata.kernels.gen.loop import GenResult
    from strata.kernels.gen.metrics import Scores
    from strata.kernels.gen.records import Attempt
    from strata.kernels.skills import Skill

Progress = Callable[[str], AbstractContextManager[Callable[..., None]]]
"""Opens a status line with a message for a long step and gives the step its callback (the
CLI chooses how the line looks: generate's board, the evaluation's latest message)."""


@dataclass
class ModelServer:
    """The OpenAI-compatible server the models answer on (--endpoint, --api-key-env,
    --stream, --request-timeout)."""

    endpoint: str
    api_key_env: str | None = None
    stream: bool = False
    timeout_s: float = 300.0

    def client(self, err: Console) -> ChatClient:
        """A chat client that says each retry on `err`."""
        from strata.kernels.gen.chat import ChatClient

        return ChatClient(self.endpoint, self.api_key_env, stream=self.stream,
                          timeout_s=self.timeout_s,
                          on_retry=lambda m: err.print(m, markup=False))


def target_device(s: Session, dialect: str, device: str | None) -> str:
    """--device, checked against this host; by default cpu for c, for the other dialects
    the first GPU (else cpu). An unknown dialect fails first."""
    from strata.kernels.dialects import get_dialect

    get_dialect(dialect)
    if device is None:
        gpus = [d.key for d in s.caps.devices if d.key != "cpu"]
        device = gpus[0] if gpus and dialect != "c" else "cpu"
    if s.caps.device(device) is None:
        raise InputError(f"--device {device}: not on this host (it has "
                         f"{', '.join(d.key for d in s.caps.devices)})")
    return device


def skill_named(ref: str | None) -> Skill | None:
    """--skill: a folder or builtin:<dialect>, loaded; None without one."""
    if ref is None:
        return None
    from strata.kernels.skills import load_skill

    return load_skill(ref)


# -- generate ------------------------------------------------------------------------------

@dataclass
class GenerateOptions:
    """`strata kernels generate`'s flags."""

    op: str
    server: ModelServer
    model: str | None = None
    dialect: str = "c"
    device: str | None = None
    turns: int = 6
    samples: int = 4
    skill: str | None = None
    temperature: float = 0.7
    register: bool = True
    bench: bool = True
    timeout_s: float = 120.0
    max_tokens: int | None = None
    db: Path | None = None


def generate(o: GenerateOptions, err: Console, progress: Progress) -> GenResult:
    """A model writes o.op: the op and the skill are checked, the model resolved, the host
    probed (its roofline measured when --bench and missing), then the samples' conversations
    run under `progress(title)`, whose callback takes (sample, turn, status)."""
    from strata.kernels.gen.loop import GenConfig
    from strata.kernels.gen.loop import generate as run_generate
    from strata.kernels.spec import get_spec

    get_spec(o.op)
    skill = skill_named(o.skill)
    with o.server.client(err) as client:
        name = client.resolve_model(o.model)
        s = probed_session(o.db, err)
        target = target_device(s, o.dialect, o.device)
        roof = s.host.roofline(err) if o.bench else None
        cfg = GenConfig(op=o.op, dialect=o.dialect, device=target, model=name, turns=o.turns,
                        samples=o.samples, temperature=o.temperature, max_tokens=o.max_tokens,
                        skill=skill, register=o.register, bench=o.bench,
                        timeout_s=o.timeout_s, jobs=default_jobs())
        with progress(f"{name} writing {o.op} ({o.dialect}, {target})…") as on_turn:
            return run_generate(cfg, client, s.conn, roof, on_turn)


# -- attempts ------------------------------------------------------------------------------

def attempts(db: Path | None, *, op: str | None = None, run: str | None = None,
             model: str | None = None, export: Path | None = None) -> list[Attempt]:
    """The stored model replies (of this op, run, model), newest last; with `export` also
    written there whole as JSON lines (`kernels eval --replay` reads them)."""
    from strata.paths import default_db_path
    from strata.store import open_db
    from strata.store.attempts import export_jsonl, list_attempts

    found = list_attempts(open_db(db or default_db_path()), op=op, run=run, model=model)
    if export is not None:
        export_jsonl(found, export)
    return found


# -- eval ----------------------------------------------------------------------------------

@dataclass
class EvalOptions:
    """`strata kernels eval`'s flags: a model server, or a replay of recorded replies."""

    server: ModelServer | None = None
    models: str | None = None
    ops: str = "all"
    dialect: str = "c"
    device: str | None = None
    samples: int = 4
    turns: int = 4
    skill: str | None = None
    temperature: float = 0.7
    replay: Path | None = None
    bench: bool = True
    timeout_s: float = 120.0
    db: Path | None = None


def leaderboard(o: EvalOptions, err: Console, progress: Progress) -> list[Scores]:
    """Models as kernel writers on this host: each model writes each op (or a replay's
    recorded replies are judged again) under `progress("evaluating…")`, whose callback
    takes a message; the attempts scored per model (pass@k for the k the samples allow)."""
    from strata.kernels.gen.evaluate import EvalConfig, resolve_ops, run_eval, shape_sets
    from strata.kernels.gen.evaluate import replay as replay_run
    from strata.kernels.gen.metrics import score

    op_list = resolve_ops(o.ops, o.dialect)
    skill = skill_named(o.skill)
    s = probed_session(o.db, err)
    target = target_device(s, o.dialect, o.device)
    roof = s.host.roofline(err) if o.bench else None
    with progress("evaluating…") as say:
        if o.replay is not None:
            if not o.replay.is_file():
                raise InputError(f"--replay {o.replay}: not found (write one with `strata "
                                 "kernels attempts --export FILE.jsonl`)")
            found = replay_run(o.replay, s.conn, roof, bench=o.bench, timeout_s=o.timeout_s,
                               jobs=default_jobs(), say=say)
        else:
            assert o.server is not None
            with o.server.client(err) as client:
                names = [m.strip() for m in (o.models or "").split(",") if m.strip()] or [None]
                cfg = EvalConfig(models=[client.resolve_model(m) for m in names],
                                 ops=op_list, dialect=o.dialect, device=target,
                                 samples=o.samples, turns=o.turns, temperature=o.temperature,
                                 skill=skill, bench=o.bench, timeout_s=o.timeout_s,
                                 jobs=default_jobs(), shapes=shape_sets(o.ops))
                found = run_eval(cfg, client, s.conn, roof, say)
    return score(found, ks=recorded_ks(found))


def recorded_ks(found: list[Attempt]) -> tuple[int, ...]:
    """pass@k for the k the recorded samples allow (a replay's, not the --samples flag's)."""
    samples = len({a.sample for a in found})
    return tuple(k for k in (1, 2, 4, 8, 16) if k <= samples) or (1,)
