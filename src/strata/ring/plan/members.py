"""A ring member: one process on one device of one host, as the others see it.

What a member advertises is what the plan needs (how much it can hold, how fast it streams
memory) and what membership needs (where to reach it, its strata version, its epoch). The
figures come from the same places every other command reads them: available memory as
`strata fit` budgets it (strata.fit.verdict.budgets), bandwidth and FLOP/s from this host's
stored roofline (`strata probe --measure`), η from this host's past torch bench results.

`mem_cap_bytes` caps what a member offers: how tests and one-machine figures emulate small
nodes, and how a user keeps memory back for other work.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from strata.errors import InputError

if TYPE_CHECKING:
    from strata.hardware.profile import HostProfile
    from strata.measure.roofline import Roofline

GiB = 2**30
HEADROOM = 0.9  # a member's share must fit in this fraction of what it offers (issue 15)
RING_BACKEND = "torch"  # the ring's stages run in PyTorch: its η is the one that applies
COMPUTE_DTYPE = "fp32"  # the stages compute in float32 (the runtime's activations)


@dataclass  # not frozen: the daemon sets .port once its server has bound one
class Member:
    id: str  # unique in the ring; the leader is the lowest id
    host: str  # address the others reach it at
    port: int  # its control port (0: not serving, e.g. an emulated member)
    device: str  # "cpu", "cuda:0" (roofline device names)
    available_bytes: int  # memory the device had free when probed
    mem_cap_bytes: int | None  # --mem-cap: the most it offers, whatever is free
    bandwidth_Bps: float | None  # measured memory bandwidth (roofline), bytes/s; None: unmeasured
    flops: float | None  # measured FLOP/s at COMPUTE_DTYPE; None: unmeasured
    strata_version: str
    epoch: int  # membership epoch it last joined
    decode_eta: float | None = None  # η of its past torch decode results (None: the prior)

    @property
    def offered_bytes(self) -> int:
        """What it offers: its free memory, capped by --mem-cap."""
        if self.mem_cap_bytes is None:
            return self.available_bytes
        return min(self.available_bytes, self.mem_cap_bytes)

    @property
    def usable_bytes(self) -> int:
        """What a plan may fill: HEADROOM x what it offers (room for buffers and the
        runtime, which the plan does not itemise)."""
        return int(HEADROOM * self.offered_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The wire form (JSON-safe): every field by name."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Member:
        """From the wire form. Unknown keys are ignored (a newer peer may send more); a
        missing or mistyped field is an InputError naming it."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                if f.default is not MISSING:  # an optional field an older peer lacks
                    continue
                raise InputError(f"member {data.get('id', '?')}: missing field {f.name}")
            kwargs[f.name] = data[f.name]
        member = cls(**kwargs)
        member.check()
        return member

    def check(self) -> None:
        """InputError for values no real member can have."""
        if not isinstance(self.id, str) or not self.id:
            raise InputError(f"member {self.id!r}: id must be a non-empty string")
        if not isinstance(self.available_bytes, int) or self.available_bytes < 0:
            raise InputError(f"member {self.id}: available_bytes must be an integer >= 0")
        if self.mem_cap_bytes is not None and self.mem_cap_bytes <= 0:
            raise InputError(f"member {self.id}: mem_cap_bytes must be > 0 (or null)")
        for name in ("bandwidth_Bps", "flops", "decode_eta"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise InputError(f"member {self.id}: {name} must be a number > 0 (or null)")

    @classmethod
    def local(cls, device: str = "cpu", *, name: str | None = None, host: str = "127.0.0.1",
              port: int = 0, mem_cap_bytes: int | None = None, epoch: int = 0,
              conn: sqlite3.Connection | None = None, profile: HostProfile | None = None,
              roofline: Roofline | None = None) -> Member:
        """This host's `device` as a member. Memory as `strata fit` budgets it; bandwidth and
        FLOP/s from `roofline`, else the one stored in `conn` for this host (None when
        neither has it: the plan then says its times are not predicted); η from this
        host's past torch decode results in `conn`. Nothing is measured or written."""
        from strata import __version__
        from strata.fit.verdict import budgets
        from strata.host import _profile

        profile = profile or _profile()
        budget = next((b for b in budgets(profile) if b.device == device), None)
        if budget is None:
            have = ", ".join(b.device for b in budgets(profile))
            raise InputError(f"--device {device}: this host has no such device (it has: {have})")
        fingerprint = profile.fingerprint()
        if roofline is None and conn is not None:
            roofline = _stored_roofline(conn, fingerprint)
        roof = roofline.device(device) if roofline is not None else None
        gbs = roof.peak_bandwidth_gbs() if roof is not None else None
        gflops = roof.peak_gflops(COMPUTE_DTYPE) if roof is not None else None
        eta = _decode_eta(conn, fingerprint, device, profile) if conn is not None else None
        default_id = profile.hostname if device == "cpu" else f"{profile.hostname}-{device}"
        member = cls(id=name or default_id, host=host, port=port, device=device,
                     available_bytes=budget.available or 0, mem_cap_bytes=mem_cap_bytes,
                     bandwidth_Bps=gbs * 1e9 if gbs else None,
                     flops=gflops * 1e9 if gflops else None, strata_version=__version__,
                     epoch=epoch, decode_eta=eta)
        member.check()
        return member


def _stored_roofline(conn: sqlite3.Connection, fingerprint: str) -> Roofline | None:
    from strata.measure.roofline import Roofline
    from strata.store.hosts import latest_measurement

    stored = latest_measurement(conn, fingerprint, "roofline")
    return Roofline.from_dict(stored) if stored else None


def _decode_eta(conn: sqlite3.Connection, fingerprint: str, device: str,
                profile: HostProfile) -> float | None:
    """The median η of this host's past torch decode results on `device` (fit's rule and
    exclusions); None where there are none (the plan then uses fit's prior)."""
    from strata.fit.predict import EtaHistory

    history = EtaHistory.from_db(conn, fingerprint, RING_BACKEND,
                                 profile.cpu.last_level_cache_bytes())
    eta = history.eta(device, "decode")
    return eta.value if eta.n else None


# -- emulated members (--node NAME:GiB[:GB/s]) ---------------------------------------------

_NODE = re.compile(r"^(?P<id>[A-Za-z0-9_.-]+):(?P<gib>[0-9.]+)(?::(?P<gbs>[0-9.]+))?$")


def emulated(text: str, *, epoch: int = 0) -> Member:
    """`NAME:GiB[:GB/s]` -> a member that offers GiB of memory and streams GB/s (no
    bandwidth: its time is not predicted). For planning before the hardware exists, and for
    tests."""
    from strata import __version__

    m = _NODE.match(text.strip())
    if m is None:
        raise InputError(f"--node {text}: expected NAME:GiB or NAME:GiB:GB/s "
                         "(e.g. --node pi5:8:17)")
    try:
        gib = float(m["gib"])
        gbs = float(m["gbs"]) if m["gbs"] else None
    except ValueError:
        raise InputError(f"--node {text}: GiB and GB/s must be numbers") from None
    if gib <= 0 or (gbs is not None and gbs <= 0):
        raise InputError(f"--node {text}: GiB and GB/s must be > 0")
    return Member(id=m["id"], host="", port=0, device="cpu", available_bytes=int(gib * GiB),
                  mem_cap_bytes=None, bandwidth_Bps=gbs * 1e9 if gbs else None, flops=None,
                  strata_version=__version__, epoch=epoch)


def capped(member: Member, cap_bytes: int | None) -> Member:
    """`member` offering at most `cap_bytes` (None: unchanged; an existing cap is kept if
    lower)."""
    if cap_bytes is None:
        return member
    cap = cap_bytes if member.mem_cap_bytes is None else min(cap_bytes, member.mem_cap_bytes)
    return replace(member, mem_cap_bytes=cap)


# -- members from a file or a daemon's status -------------------------------------------------


def from_document(doc: Any, where: str) -> list[Member]:
    """Members from JSON: a list of member objects, {"members": [...]}, or a daemon's
    status (`strata ring status -o json`: "self" and its live peers). InputError naming
    `where` for anything else."""
    if isinstance(doc, dict) and "self" in doc:  # a daemon's status reply
        raw = [doc["self"], *(p["member"] for p in doc.get("peers", [])
                              if p.get("state") == "live" and p.get("member"))]
    elif isinstance(doc, dict) and isinstance(doc.get("members"), list):
        raw = doc["members"]
    elif isinstance(doc, list):
        raw = doc
    else:
        raise InputError(f"{where}: expected a list of members, {{\"members\": [...]}} or "
                         "the output of `strata ring status -o json`")
    if not all(isinstance(m, dict) for m in raw):
        raise InputError(f"{where}: every member must be a JSON object")
    try:
        return [Member.from_dict(m) for m in raw]
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise InputError(f"{where}: a member has a field of the wrong type ({exc})") from None
