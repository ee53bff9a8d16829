"""`strata kernels eval`: models as kernel writers on this host, and `--replay`: the same
scoring of recorded replies, offline, on another host (no model is called).

An eval is one `generate` per model x op with registration off (a leaderboard must not change
what dispatch runs), all under one run id so the metrics group them. A replay re-extracts
and re-judges every recorded reply as it was written: the verdicts are this host's, the
conversation is the recorded one (feedback is not sent anywhere).
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from strata.errors import InputError
from strata.kernels.gen.loop import GenConfig, db_file, generate
from strata.kernels.gen.records import Attempt, code_hash
from strata.kernels.gen.tasksets import DEFAULT_SHAPES, resolve_tasks


@dataclass
class EvalConfig:
    models: list[str]
    ops: list[str]
    dialect: str
    device: str
    samples: int = 4
    turns: int = 4
    temperature: float = 0.7
    max_tokens: int | None = None
    skill: Any = None
    bench: bool = True
    timeout_s: float = 120.0
    concurrency: int = 4
    jobs: int = 1
    run: str = ""
    shapes: dict[str, str] = field(default_factory=dict)  # op -> set timed (default llm)

    def __post_init__(self) -> None:
        self.run = self.run or "eval-" + uuid.uuid4().hex[:8]


def resolve_ops(spec: str, dialect: str) -> list[str]:
    """`all` or a comma list of ops and task sets (gen/tasksets.py), checked against the
    lab's ops."""
    return list(dict.fromkeys(t.op for t in resolve_tasks(spec)))


def shape_sets(spec: str) -> dict[str, str]:
    """op -> the shape set its benchmark times, for the ops a task set names."""
    return {t.op: t.shapes for t in resolve_tasks(spec) if t.shapes != DEFAULT_SHAPES}


Say = Callable[[str], None]


def run_eval(cfg: EvalConfig, client: Any, conn: sqlite3.Connection, roofline: Any,
             say: Say = lambda m: None) -> list[Attempt]:
    """Every model on every op: `samples` conversations of up to `turns` turns each."""
    attempts: list[Attempt] = []
    for model in cfg.models:
        for op in cfg.ops:
            gen = GenConfig(op=op, dialect=cfg.dialect, device=cfg.device, model=model,
                            turns=cfg.turns, samples=cfg.samples,
                            temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                            skill=cfg.skill, register=False, bench=cfg.bench,
                            timeout_s=cfg.timeout_s, concurrency=cfg.concurrency,
                            jobs=cfg.jobs, run=cfg.run,
                            shapes=cfg.shapes.get(op, DEFAULT_SHAPES))
            result = generate(gen, client, conn, roofline,
                              lambda s, t, w, m=model, o=op: say(
                                  f"{m} · {o} · sample {s + 1} turn {t}: {w}"))
            attempts += result.attempts
    return attempts


def replay(path: Path, conn: sqlite3.Connection, roofline: Any, *, bench: bool = True,
           timeout_s: float = 120.0, jobs: int = 1, say: Say = lambda m: None) -> list[Attempt]:
    """Re-score recorded replies (a `kernels attempts --export` file) on this host."""
    from strata.store.attempts import read_jsonl

    recorded = read_jsonl(path)
    if not recorded:
        raise InputError(f"--replay {path}: no attempts in the file (write one with "
                         "`strata kernels attempts --export FILE.jsonl`)")
    run = "replay-" + uuid.uuid4().hex[:8]
    lock = threading.Lock()
    done = [0]
    db = db_file(conn)  # each thread opens its own connection to it

    def one(rec: Attempt) -> Attempt:
        result = _rejudge(rec, db, roofline, bench, timeout_s, run,
                          f"replay:{path.name}")
        with lock:
            done[0] += 1
            say(f"{done[0]}/{len(recorded)} {rec.model} · {rec.op} · sample "
                f"{rec.sample + 1} turn {rec.turn}: {result.status}")
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, recorded))


def _rejudge(rec: Attempt, db: Path, roofline: Any, bench: bool, timeout_s: float,
             run: str, endpoint: str) -> Attempt:
    from strata.kernels.gen.judge import judge_reply
    from strata.kernels.gen.loop import entry_symbol
    from strata.kernels.service import session
    from strata.store import open_db
    from strata.store.attempts import save_attempt

    conn = open_db(db)
    try:
        s = session(conn=conn)
        device = rec.device if s.caps.device(rec.device) is not None else _fallback(s, rec)
        judged, code = judge_reply(s, rec.reply, rec.op, rec.dialect, device,
                                   roofline if bench else None,
                                   entry=entry_symbol(rec.op, rec.dialect),
                                   timeout_s=timeout_s, bench=bench)
        new = replace(rec, run=run, endpoint=endpoint, fingerprint=s.fingerprint, id=None,
                      created_at="", device=device, status=judged.status,
                      reason=judged.reason, cheat=judged.cheat, feedback=judged.feedback,
                      registered=False, timing=judged.timing, code=code,
                      code_hash=code_hash(code) if code is not None else None)
        new.id = save_attempt(conn, new)
        return new
    finally:
        conn.close()


def _fallback(s: Any, rec: Attempt) -> str:
    """A recorded GPU attempt replayed on a host without that device: the dialect's own rule
    decides (Triton's interpreter on the CPU; CUDA compile-checks only)."""
    gpus = [d.key for d in s.caps.devices if d.key != "cpu"]
    return gpus[0] if gpus else "cpu"
