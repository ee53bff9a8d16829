"""What a generation run produces and stores: one `Attempt` per model reply."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

# The status class of one reply, in the order the judge meets them (first failure wins):
# format (no usable code block), static (refused before compiling: static check, forbidden
# link), compile (the build failed), runtime (crash, timeout, sandbox violation, a guard such
# as a thread left running), mismatch (wrong numbers, modified inputs, NaN parity, constant or
# input-independent output, nondeterminism), implausible (a time the roofline forbids, or a
# speedup that did not survive re-timing), slow (correct, slower than torch eager), ok.
STATUSES = ("format", "static", "compile", "runtime", "mismatch", "implausible", "slow", "ok")
CORRECT = ("slow", "ok")  # verified correct on this host
CHEATS = ("static", "runtime", "implausible")  # where the judge's guards fire (see `cheat`)


@dataclass(frozen=True)
class Reply:
    """One chat completion, as the client received it."""

    text: str
    model: str
    tokens_in: int | None  # from `usage`; None when the server does not report it
    tokens_out: int | None
    latency_s: float
    finish_reason: str | None = None


@dataclass
class Timing:
    """A correct candidate's speed at the `llm` shapes (geometric means over shapes)."""

    speedup_eager: float | None = None  # eager time / candidate time (> 1: faster than torch)
    speedup_best: float | None = None  # best verified implementation's time / candidate time
    roofline_share: float | None = None  # ceiling time / candidate time (1.0 = at the roofline)
    seconds: float | None = None  # candidate's median time at the largest shape


@dataclass
class Attempt:
    """One turn of one sample: the request sent, the reply, and the lab's verdict on it."""

    op: str
    dialect: str
    device: str
    endpoint: str
    model: str
    template_hash: str
    sample: int
    turn: int
    prompt: str  # the messages sent this turn, as JSON
    reply: str  # raw reply text
    status: str  # one of STATUSES
    reason: str = ""  # the judge's reason code (checks.*) or extraction problem
    feedback: str = ""  # the text sent back to the model for the next turn
    code: str | None = None  # extracted source (None: format failure)
    code_hash: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    latency_s: float | None = None
    timing: Timing = field(default_factory=Timing)
    cheat: bool = False  # a guard fired (sandbox, link check, plausibility, input tampering)
    registered: bool = False
    skill: str | None = None  # skill name@hash, or None
    run: str = ""  # id of the `kernels generate`/`eval` invocation (groups samples)
    fingerprint: str = ""
    created_at: str = ""
    id: int | None = None

    @property
    def correct(self) -> bool:
        return self.status in CORRECT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()[:16]
