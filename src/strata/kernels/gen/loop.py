"""The generation loop: N independent conversations (samples) of up to T turns each; every
reply goes through the lab's judge and the verdict goes back as the next turn's message.

Stopping rules per sample: the turn cap; the same failure three times in a row (status,
reason and first feedback line equal: the model is stuck); or a correct candidate within 10%
of the roofline ceiling (nothing left to win). Requests run one thread per sample (bounded
by `concurrency`); verifications are bounded separately by the cores (`jobs`), since each
one is a sandboxed process. Every attempt is stored as it happens, so an interrupted run
keeps what it did.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.kernels.gen.records import STATUSES, Attempt, Reply, code_hash

AT_ROOFLINE = 0.9  # a correct candidate at >= 90% of the ceiling ends its sample
STUCK_AFTER = 3  # the same failure this many times in a row ends a sample
KEEP_EXCHANGES = 2  # earlier reply/feedback pairs kept in the context (small local models)


@dataclass
class GenConfig:
    op: str
    dialect: str
    device: str
    model: str
    turns: int = 6
    samples: int = 4
    temperature: float = 0.7
    max_tokens: int | None = None
    skill: Any = None  # strata.kernels.skills.Skill | None
    register: bool = True
    bench: bool = True
    timeout_s: float = 120.0  # sandbox seconds per candidate
    concurrency: int = 4  # conversations in flight
    jobs: int = 1  # verifications at once
    seed: int | None = 0  # per-turn request seed = seed + 1000*sample + turn (same in A/B arms)
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    shapes: str = "llm"  # the op's shape set the benchmark times (a task set may name another)


@dataclass
class SampleResult:
    sample: int
    attempts: list[Attempt] = field(default_factory=list)
    stop: str = ""  # why the conversation ended

    @property
    def best(self) -> Attempt | None:
        return best_of(self.attempts)


@dataclass
class GenResult:
    config: GenConfig
    samples: list[SampleResult]
    registered: str | None = None  # implementation key, when the best was registered

    @property
    def attempts(self) -> list[Attempt]:
        return [a for s in self.samples for a in s.attempts]

    @property
    def best(self) -> Attempt | None:
        return best_of(self.attempts)


def best_of(attempts: list[Attempt]) -> Attempt | None:
    """The fastest correct attempt (by speedup over eager; an unbenched correct one counts
    as 0), else None."""
    correct = [a for a in attempts if a.correct]
    return max(correct, key=lambda a: a.timing.speedup_eager or 0.0, default=None)


Progress = Callable[[int, int, str], None]  # (sample, turn, status or "asking"/"judging")


@dataclass
class _Shared:
    """What every sample thread reads; the lock serialises nothing but the progress calls."""

    config: GenConfig
    client: Any  # chat.ChatClient
    prompt: Any  # prompt.Prompt
    roofline: Any
    db_path: Path
    slots: threading.Semaphore
    progress: Progress
    lock: threading.Lock = field(default_factory=threading.Lock)

    def say(self, sample: int, turn: int, what: str) -> None:
        with self.lock:
            self.progress(sample, turn, what)


def generate(config: GenConfig, client: Any, conn: sqlite3.Connection, roofline: Any,
             progress: Progress = lambda s, t, w: None) -> GenResult:
    """Run `config.samples` conversations with the model behind `client` and judge every
    reply on this host. The best correct kernel is registered when `config.register`."""
    from strata.kernels.gen.prompt import build_prompt
    from strata.kernels.service import session

    skill_text = config.skill.text if config.skill is not None else None
    prompt = build_prompt(session(conn=conn), config.op, config.dialect, config.device,
                          roofline, skill_text=skill_text, shapes=config.shapes)
    shared = _Shared(config, client, prompt, roofline, db_file(conn),
                     threading.Semaphore(max(1, config.jobs)), progress)
    workers = max(1, min(config.concurrency, config.samples))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="strata-gen") as pool:
        samples = list(pool.map(lambda i: _conversation(shared, i), range(config.samples)))
    result = GenResult(config, samples)
    if config.register and result.best is not None:
        result.registered = _register(conn, config, result.best)
    return result


def db_file(conn: sqlite3.Connection) -> Path:
    """The file behind `conn`: each sample thread opens its own connection to it (an SQLite
    connection belongs to the thread that made it)."""
    row = conn.execute("PRAGMA database_list").fetchone()
    return Path(row[2])


def _conversation(shared: _Shared, sample: int) -> SampleResult:
    from strata.kernels.service import session
    from strata.store import open_db

    conn = open_db(shared.db_path)
    try:
        return _turns(shared, sample, session(conn=conn))
    finally:
        conn.close()


def _turns(shared: _Shared, sample: int, session: Any) -> SampleResult:
    from strata.kernels.gen.prompt import feedback_prompt
    from strata.store.attempts import save_attempt

    cfg = shared.config
    result = SampleResult(sample)
    first = list(shared.prompt.messages)
    exchanges: list[dict[str, str]] = []
    for turn in range(1, cfg.turns + 1):
        messages = first + exchanges[-2 * KEEP_EXCHANGES:]
        shared.say(sample, turn, "asking")
        seed = None if cfg.seed is None else cfg.seed + 1000 * sample + turn
        reply = shared.client.chat(cfg.model, messages, temperature=cfg.temperature,
                                   max_tokens=cfg.max_tokens, seed=seed)
        shared.say(sample, turn, "judging")
        attempt = _judge(shared, session, sample, turn, messages, reply)
        attempt.id = save_attempt(session.conn, attempt)
        result.attempts.append(attempt)
        shared.say(sample, turn, attempt.status)
        result.stop = _stop_reason(result.attempts, cfg.turns)
        if result.stop:
            break
        exchanges += [{"role": "assistant", "content": reply.text},
                      feedback_prompt(attempt.status, attempt.feedback)]
    return result


def _judge(shared: _Shared, session: Any, sample: int, turn: int,
           messages: list[dict[str, str]], reply: Reply) -> Attempt:
    from strata.kernels.gen.judge import judge_reply

    cfg = shared.config
    with shared.slots:
        judged, code = judge_reply(session, reply.text, cfg.op, cfg.dialect, cfg.device,
                                   shared.roofline if cfg.bench else None,
                                   entry=entry_symbol(cfg.op, cfg.dialect),
                                   timeout_s=cfg.timeout_s, bench=cfg.bench,
                                   shapes=cfg.shapes)
    return Attempt(
        op=cfg.op, dialect=cfg.dialect, device=cfg.device, endpoint=shared.client.endpoint,
        model=cfg.model, template_hash=shared.prompt.template_hash, sample=sample, turn=turn,
        prompt=json.dumps(messages), reply=reply.text, status=judged.status,
        reason=judged.reason, feedback=judged.feedback, code=code,
        code_hash=code_hash(code) if code is not None else None, tokens_in=reply.tokens_in,
        tokens_out=reply.tokens_out, latency_s=reply.latency_s, timing=judged.timing,
        cheat=judged.cheat, skill=_skill_label(cfg.skill), run=cfg.run,
        fingerprint=session.fingerprint)


def entry_symbol(op: str, dialect: str) -> str:
    """The function a reply must define (the prompt names the same one)."""
    from strata.kernels.gen.rules import entry_for

    return entry_for(op, dialect)


def _skill_label(skill: Any) -> str | None:
    return None if skill is None else f"{skill.name}@{skill.hash}"


def _stop_reason(attempts: list[Attempt], turns: int) -> str:
    last = attempts[-1]
    share = last.timing.roofline_share
    if last.correct and share is None:
        return "correct (not timed: nothing to improve against)"
    if last.correct and share >= AT_ROOFLINE:
        return f"within {1 - AT_ROOFLINE:.0%} of the roofline ceiling"
    tail = attempts[-STUCK_AFTER:]
    if len(tail) == STUCK_AFTER and not last.correct and len({_failure_key(a)
                                                               for a in tail}) == 1:
        return f"the same {last.status} failure {STUCK_AFTER} times"
    if len(attempts) >= turns:
        return "turn cap"
    return ""


def _failure_key(a: Attempt) -> tuple[str, str, str]:
    return a.status, a.reason, (a.feedback.splitlines() or [""])[0]


def _register(conn: sqlite3.Connection, config: GenConfig, best: Attempt) -> str | None:
    """Register the best correct kernel through the `kernels add` door (it is verified
    again there, against its stored copy)."""
    from strata.kernels.gen.judge import register_candidate
    from strata.kernels.service import session
    from strata.store.attempts import mark_registered

    assert best.code is not None and best.id is not None
    impl = register_candidate(session(conn=conn), config.op, config.dialect, best.code,
                              timeout_s=config.timeout_s)
    mark_registered(conn, best.id)
    best.registered = True
    return impl.key


def status_counts(attempts: list[Attempt]) -> dict[str, int]:
    return {s: sum(a.status == s for a in attempts) for s in STATUSES}
