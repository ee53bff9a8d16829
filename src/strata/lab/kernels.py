"""The lab ops a model needs on one device, resolved by dispatch, with their accounting.

Every op goes through `strata.kernels` dispatch (the fastest verified implementation here,
else torch's op reported as a fallback); built-ins are verified first where nothing is
(`kernels.ensure`). `Kernels.call` runs an op into a preallocated output; with `profile`
on it also sums the wall time per op (the device synchronised around each call), which is
what the per-op profile of a decode step reads.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from strata.errors import InputError
from strata.hardware.devices import key_for, sync
from strata.lab.plan import ops_for


def needed_ops(matrix_kinds: Iterable[str]) -> list[str]:
    """The lab ops a model whose 2-D weights have these storage types runs (the table is
    lab/plan.py's, which `strata fit -B lab` plans with)."""
    ops, unread = ops_for(matrix_kinds)
    if unread:
        raise InputError(f"-B lab: no lab op multiplies {', '.join(unread)} weights yet "
                         "(strata fit MODEL -B lab lists what is missing); use --backend "
                         "llamacpp")
    return ops


@dataclass
class Kernels:
    """op -> dispatched Choice, for one device."""

    device: torch.device
    choices: dict[str, Any]
    profile: bool = False
    seconds: Counter = field(default_factory=Counter)  # op -> wall seconds (profile on)
    calls: Counter = field(default_factory=Counter)

    @classmethod
    def resolve(cls, ops: list[str], device: torch.device, conn: Any,
                say: Callable[[str], None]) -> Kernels:
        from strata.host import this_host
        from strata.kernels import choose
        from strata.kernels.ensure import ensure_verified

        where = key_for(device)
        host = this_host(conn)
        ensure_verified(host, ops, where, say, " for -B lab")
        return cls(device, choose(host, ops, where))

    def call(self, op: str, out: torch.Tensor, *inputs: torch.Tensor,
             **params: Any) -> torch.Tensor:
        if not self.profile:
            return self.choices[op].run_packed(out, *inputs, **params)
        sync(self.device)
        t0 = time.perf_counter()
        self.choices[op].run_packed(out, *inputs, **params)
        sync(self.device)
        self.seconds[op] += time.perf_counter() - t0
        self.calls[op] += 1
        return out

    def served(self) -> dict[str, dict[str, Any]]:
        """op -> {impl, outcome, why}: which implementation serves each op, and why."""
        out = {}
        for op, choice in self.choices.items():
            d = choice.decision
            why = next((t.reason for t in d.trace if t.verdict in ("chosen", "fallback")), "")
            out[op] = {"impl": d.chosen, "outcome": d.outcome, "why": why}
        return out


