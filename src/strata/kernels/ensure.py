"""Make sure the ops a caller is about to run have a verified kernel on a device.

Dispatch only picks verified implementations; a model runner (`strata train --kernels lab`,
`-B lab`) would otherwise fall back to torch on a fresh host. For each op, its built-ins that
run there and have no verdict yet are verified — vectorised before naive, stopping at the
first that passes (one that passed before counts as that first). Sandboxed and cached per
source hash, so this costs seconds once per host. Benchmarks are not run here (minutes):
`strata kernels bench OP` lets dispatch choose by speed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable

from strata.kernels.capability import HostCaps, KernelHost
from strata.kernels.dispatch import unrunnable_reason
from strata.kernels.impl import Implementation
from strata.kernels.registry import implementations
from strata.kernels.sandbox import SandboxPolicy
from strata.kernels.verify import VerifyContext, verify_many
from strata.store.kernels import latest_verification


def ensure_verified(host: KernelHost, ops: Iterable[str], device: str,
                    say: Callable[[str], None], why: str = "", timeout_s: float = 300.0,
                    jobs: int = 2) -> None:
    """Verify, per op lacking a pass on `device`, its runnable built-ins until one passes."""
    conn, fingerprint, caps = host.conn, host.fingerprint, host.caps
    queues = {op: _pending(conn, fingerprint, candidates(conn, caps, op, device), device)
              for op in ops}
    queues = {op: q for op, q in queues.items() if q}
    ctx = VerifyContext(conn, fingerprint, caps, SandboxPolicy(timeout_s=timeout_s),
                        force=False, progress=say)
    while queues:
        batch = [q.pop(0) for q in queues.values()]
        say(f"verifying {', '.join(i.key for i in batch)}{why} (once per host)…")
        passed = {v.impl.op for v in verify_many(batch, ctx, jobs) if v.passed}
        queues = {op: q for op, q in queues.items() if op not in passed and q}


def candidates(conn: sqlite3.Connection, caps: HostCaps, op: str,
               device: str) -> list[Implementation]:
    """Implementations of `op` that can serve `device` here: the built-ins first, the most
    specialised of them first (Implementation.specialisation, as dispatch prefers them
    while none is timed), then external kernels. An external one never goes ahead of a
    built-in, whatever CPU features it declares: its pass would end the queue with the
    built-ins unverified, and dispatch serves an external kernel only once benchmarked."""
    runnable = [i for i in implementations(op, conn)
                if not i.is_baseline and unrunnable_reason(i, device, caps) is None]
    return sorted(runnable, key=lambda i: (i.origin != "builtin", -i.specialisation,
                                           i.name.endswith(".naive")))


def _pending(conn: sqlite3.Connection, fingerprint: str, impls: list[Implementation],
             device: str) -> list[Implementation]:
    """The candidates preferred to the first that passed (all, if none did) that have no
    verdict yet: a vectorised built-in that arrived after its naive twin passed still gets
    its turn, and one that failed is not retried (its source hash has a verdict)."""
    pending = []
    for impl in impls:
        got = latest_verification(conn, fingerprint, impl.op, impl.name,
                                  impl.content_hash(), device)
        if got is not None and got.status == "pass":
            break
        if got is None:
            pending.append(impl)
    return pending
