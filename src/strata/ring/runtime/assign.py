"""Who holds which layers: stage assignments, their checks, and whether the ranks can hold them.

A planner (strata.ring.plan.partition) chooses the ranges from each member's memory and speed; this
module only checks what the data plane is given (contiguous ranges covering every layer, one
per rank in ring order) and, after a lost peer, whether the survivors' memory caps can take
their new shares, from the GGUF header alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.errors import InputError
from strata.ring.runtime.stage import stage_bytes


@dataclass(frozen=True)
class StageAssignment:
    rank: int
    first: int  # layers [first, last)
    last: int


def even_split(n_layers: int, world: int) -> list[StageAssignment]:
    """Contiguous, near-equal layer ranges (a stand-in where no capacity plan is given)."""
    if not 1 <= world <= n_layers:
        raise InputError(f"cannot split {n_layers} layers over {world} ranks")
    cuts = [round(i * n_layers / world) for i in range(world + 1)]
    return [StageAssignment(r, cuts[r], cuts[r + 1]) for r in range(world)]


def check_assignments(n_layers: int, assignments: list[StageAssignment], world: int) -> None:
    ranks = [a.rank for a in assignments]
    layers = [(a.first, a.last) for a in sorted(assignments, key=lambda a: a.rank)]
    contiguous = all(layers[i][1] == layers[i + 1][0] for i in range(len(layers) - 1))
    if (ranks != list(range(world)) or not layers or layers[0][0] != 0
            or layers[-1][1] != n_layers or not contiguous):
        raise InputError(f"stage assignments {layers} on ranks {ranks} do not cover layers "
                         f"0..{n_layers} in rank order over {world} ranks")


def check_fit(model_ref: str, assignments: list[StageAssignment], ctx: int,
              caps: dict[int, int | None]) -> None:
    """InputError naming what is missing when a rank's share (weights as held + KV cache at
    `ctx`) exceeds its memory cap; nothing is read but the GGUF header."""
    from strata.models.source import resolve

    spec = resolve(model_ref).spec_for("gguf")
    if spec is None:
        raise InputError(f"MODEL {model_ref}: no weights to split (an endpoint?)")
    short = []
    for a in assignments:
        cap = caps.get(a.rank)
        w, kv = stage_bytes(spec, a.first, a.last, ctx)
        if cap is not None and w + kv > cap:
            short.append(f"rank {a.rank} needs {_mib(w + kv)} for layers [{a.first}, "
                         f"{a.last}) but may use {_mib(cap)}")
    if short:
        total = sum(stage_bytes(spec, a.first, a.last, ctx)[0] for a in assignments) + \
            stage_bytes(spec, 0, spec.n_layers, ctx)[1]
        room = sum(c for c in (caps.get(a.rank) for a in assignments) if c is not None)
        raise InputError(
            f"the {len(assignments)} remaining ranks cannot hold {model_ref}: "
            f"{'; '.join(short)} (the model needs {_mib(total)} with a {ctx}-position KV "
            f"cache, the ranks may use {_mib(room)} in all): add a node or raise --mem-cap")


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
