"""The kernel lab's service: the host's session and what `strata kernels` and
`strata.kernels` do with it (verify, add and register, remove, trust, list, bench). Every
function takes a `Session` (a `strata.host.Host`) or the DB; printing lives in
views/kernels.py, flags and wording in cli/kernels.py and commands/kernels.py."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from strata.errors import InputError
from strata.host import Host, this_host
from strata.kernels.capability import HostCaps
from strata.kernels.impl import Implementation, from_source
from strata.kernels.registry import find, implementations
from strata.kernels.sandbox import SandboxPolicy
from strata.kernels.verify import Verdict, VerifyContext, verify_many
from strata.paths import cache_dir, publish


@dataclass
class Session:
    """The kernel lab's view of this host: everything comes from `host`."""

    host: Host

    @property
    def conn(self) -> sqlite3.Connection:
        return self.host.conn

    @property
    def fingerprint(self) -> str:
        return self.host.fingerprint

    @property
    def caps(self) -> HostCaps:
        return self.host.caps


def session(db: Path | None = None, conn: sqlite3.Connection | None = None) -> Session:
    """This host (strata.host: probed once per process), its fingerprint and the DB."""
    from strata.paths import default_db_path
    from strata.store import open_db

    return Session(this_host(conn or open_db(db or default_db_path())))


def select(op: str | None, impl: str | None, conn: sqlite3.Connection) -> list[Implementation]:
    if impl and not op:
        raise InputError("--impl needs an OP (e.g. strata kernels verify rmsnorm --impl c.avx2)")
    if op and impl:
        return [find(op, impl, conn)]
    return implementations(op, conn)


def default_jobs() -> int:
    """Sandboxes at once: each is mostly one Python process importing torch."""
    return max(1, min(4, os.cpu_count() or 1))


def run_verify(s: Session, impls: list[Implementation], *, force: bool, timeout_s: float,
               progress: Callable[[str], None], static: bool = True,
               jobs: int | None = None) -> list[Verdict]:
    ctx = VerifyContext(s.conn, s.fingerprint, s.caps, SandboxPolicy(timeout_s=timeout_s),
                        force=force, static=static, progress=progress)
    return verify_many([i for i in impls if not i.is_baseline], ctx, jobs or default_jobs())


# -- add ---------------------------------------------------------------------------------------

def abi_path() -> Path:
    """The kernel ABI document shipped with the package (what `kernels add` expects of a
    source file; `strata kernels abi` prints it). docs/kernels-abi.md is the same text."""
    from importlib.resources import files

    return Path(str(files("strata.kernels") / "ABI.md"))


def _abi_error(exc: InputError) -> InputError:
    """A declaration error names the ABI document where it is installed, not a path in a
    source checkout the user may not have."""
    text, where = str(exc), str(abi_path())
    return InputError(text.replace("docs/kernels-abi.md", where) if "docs/kernels-abi.md" in text
                      else f"{text} (the kernel ABI: {where})")


def read_external(path: Path) -> Implementation:
    """An external kernel file's declaration, checked (InputError naming the ABI document)
    before anything slow runs: `kernels add` calls it before probing the host."""
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise InputError(f"FILE {path}: {what} (give the path of one kernel source file)")
    try:
        return from_source(path, origin="external")
    except InputError as exc:
        raise _abi_error(exc) from None


def add_external(s: Session, path: Path) -> Implementation:
    """A private copy of an external kernel, ready to verify (registered only if it passes:
    see `register_external`)."""
    probe = read_external(path)
    stem = path.name.split(".")[0]
    name = f"{probe.dialect}.ext.{stem}"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    # A private copy: the verified bytes are the ones dispatch later loads.
    store = cache_dir() / "kernels" / "external"
    store.mkdir(parents=True, exist_ok=True)
    copy = store / f"{digest}-{path.name}"
    if not copy.exists():  # content-named; concurrent adds of the same bytes must not tear it
        publish(copy, path.read_bytes())
    return from_source(copy, origin="external", name=name)


def register_external(s: Session, impl: Implementation, origin_path: Path) -> None:
    """Record a verified (or, without its device, compiled) external kernel for dispatch.
    A rejected version never replaces an accepted one under the same name."""
    from strata.store.kernels import ExternalImpl, _now, save_external

    save_external(s.conn, ExternalImpl(impl.key, impl.op, impl.name, impl.dialect,
                                       str(impl.source), str(origin_path.resolve()),
                                       impl.content_hash(), _now()))


@dataclass
class Removed:
    """What `strata kernels remove` undid."""

    key: str
    origin_path: str
    results: int  # verification and benchmark rows deleted
    files: list[str]  # the private copies deleted


def remove_kernel(conn: sqlite3.Connection, name: str) -> list[Removed]:
    """Undo `strata kernels add` (or `kernels generate --register`): the registration, its
    verification and benchmark rows, and the private copy of its source. NAME is the
    implementation name `strata kernels list` shows (c.ext.my_rmsnorm) or OP/NAME.
    InputError for a built-in kernel or a name that was never added."""
    from strata.store.kernels import list_external, remove_external

    found = _added_named(conn, name, "cannot be removed (only kernels added with `strata "
                         "kernels add`)")
    removed = []
    for ext in found:
        results = remove_external(conn, ext)
        copy, files = Path(ext.path), []
        still_used = any(e.path == ext.path for e in list_external(conn))
        # only the private copy `add` wrote, never the user's own file
        if copy.is_file() and not still_used and copy != Path(ext.origin_path):
            copy.unlink()
            files.append(str(copy))
        removed.append(Removed(ext.key, ext.origin_path, results, files))
    return removed


# -- trust -------------------------------------------------------------------------------------

NO_TRUST_NEEDED = ("always runs in-process; only kernels added with `strata kernels add` need "
                   "trust")


@dataclass
class TrustChange:
    """What `strata kernels trust` did to one added kernel."""

    key: str
    trusted: bool  # its state now
    changed: bool  # False: --revoke of a kernel that was not trusted
    source_hash: str | None = None
    trusted_at: str | None = None


def _added_named(conn: sqlite3.Connection, name: str,
                 builtin_why: str) -> list:  # list[ExternalImpl]
    """The added kernels NAME means; InputError for a built-in (it ships with strata and
    `builtin_why`) or a name never added."""
    from strata.kernels.impl import builtin_implementations
    from strata.kernels.registry import COMPILE, EAGER
    from strata.store.kernels import find_external, list_external

    found = find_external(conn, name)
    if found:
        return found
    builtin = {EAGER, COMPILE} | {n for i in builtin_implementations() for n in (i.name, i.key)}
    if name in builtin:
        raise InputError(f"NAME {name}: a built-in kernel ships with strata and {builtin_why}")
    added = [e.name for e in list_external(conn)]
    raise InputError(f"NAME {name}: no kernel added under this name (added: "
                     f"{', '.join(added) if added else 'none'}; `strata kernels list` "
                     "shows them as origin external)")


def trust_targets(conn: sqlite3.Connection, name: str) -> list:  # list[ExternalImpl]
    """The added kernels NAME means, each with its private copy still there to trust."""
    found = _added_named(conn, name, NO_TRUST_NEEDED)
    for ext in found:
        if not Path(ext.path).is_file():
            raise InputError(f"NAME {name}: its private copy {ext.path} is gone (the cache "
                             f"was cleaned); add it again: strata kernels add {ext.origin_path}")
    return found


def trust_kernel(conn: sqlite3.Connection, name: str, note: str = "") -> list[TrustChange]:
    """Promote added kernel NAME (c.ext.my_rmsnorm or OP/NAME) to run in the user's own
    process: an explicit act (the caller states the risk first), for the exact source bytes
    now registered; until then, and after any change to them, it runs confined."""
    from strata.store.kernels import trust_kernel as record

    changes = []
    for ext in trust_targets(conn, name):
        trust = record(conn, ext, note)
        changes.append(TrustChange(ext.key, True, True, trust.source_hash, trust.trusted_at))
    return changes


def revoke_kernel_trust(conn: sqlite3.Connection, name: str) -> list[TrustChange]:
    """Undo `trust_kernel`: NAME runs confined again."""
    from strata.store.kernels import revoke_trust

    return [TrustChange(ext.key, False, revoke_trust(conn, ext.key))
            for ext in _added_named(conn, name, NO_TRUST_NEEDED)]


# -- list --------------------------------------------------------------------------------------

def _availability(s: Session, impl: Implementation) -> tuple[str, str | None]:
    """(text for the table, device it runs on here or None)."""
    from strata.kernels.dialects import get_dialect

    dialect = get_dialect(impl.dialect)
    missing = impl.requires.check(s.caps)
    if missing:
        if dialect.compile_only(impl.requires, s.caps):
            return "compile-check only: " + missing, "compile-only"
        return "no: " + missing, None
    device = dialect.run_device(impl.requires, s.caps) or "cpu"
    untimed = dialect.untimed_reason(device)
    return (f"{device} (correctness only: interpreter)" if untimed else device), device


def list_records(s: Session, op: str | None) -> list[dict[str, object]]:
    from strata.kernels.dispatch import speed_of
    from strata.store.kernels import latest_bench, latest_verification

    records = []
    for impl in implementations(op, s.conn):
        available, device = _availability(s, impl)
        stored = latest_verification(s.conn, s.fingerprint, impl.op, impl.name,
                                     impl.content_hash(), device) if device else None
        bench = latest_bench(s.conn, s.fingerprint, impl.op, impl.name, impl.content_hash(),
                             device) if device else []
        speed = speed_of(bench)
        records.append({"op": impl.op, "impl": impl.name, "dialect": impl.dialect,
                        "requires": impl.requires.describe(), "available": available,
                        "verified": stored.status if stored else "-",
                        "speedup": speed.geomean, "speedup_low": speed.low,
                        "speedup_high": speed.high, "speedup_shapes": speed.shapes,
                        "speed_problem": speed.problem, "origin": impl.origin,
                        "trust": _trust_state(s.conn, impl)})
    return records


def _trust_state(conn: sqlite3.Connection, impl: Implementation) -> str | None:
    """How an external kernel runs: "confined" (its own process) or "trusted" (in-process,
    `strata kernels trust`); None for a built-in, which always runs in-process."""
    from strata.store.kernels import is_trusted

    if impl.origin != "external":
        return None
    return "trusted" if is_trusted(conn, impl) else "confined"


# -- bench -------------------------------------------------------------------------------------

def run_bench(s: Session, impls: list[Implementation], roofline: object, *, shapes: str,
              compile_: bool, max_time_s: float, progress: Callable[[str], None],
              timeout_s: float = 900.0, cache: str = "cold",
              dtype: str = "float32") -> list:  # list[Figure]
    from strata.kernels.bench import BenchContext, BenchSettings, bench_op

    vctx = VerifyContext(s.conn, s.fingerprint, s.caps, SandboxPolicy(timeout_s=300.0),
                         progress=progress)
    settings = BenchSettings(shapes=shapes, compile=compile_, max_time_s=max_time_s,
                             cache=cache, dtype=dtype)
    peaks = s.host.peak_keeper(roofline) if roofline is not None else None  # type: ignore
    ctx = BenchContext(vctx, roofline, settings,  # type: ignore[arg-type]
                       SandboxPolicy(timeout_s=timeout_s), default_jobs(), progress,
                       peaks)  # type: ignore[arg-type]
    figures = []
    for op in dict.fromkeys(i.op for i in impls):
        figures += bench_op(op, [i for i in impls if i.op == op], ctx)
    return figures


# -- add: the whole door an external kernel comes through --------------------------------------

@dataclass
class AddOutcome:
    impl: Implementation
    verdict: Verdict
    registered: bool = False
    figures: list = field(default_factory=list)  # list[Figure]
    decisions: list = field(default_factory=list)  # list[Decision], one per device it runs on

    @property
    def compiled_only(self) -> bool:
        return self.verdict.status == "compiled"


def add_kernel(s: Session, path: Path, *, timeout_s: float,
               progress: Callable[[str], None]) -> AddOutcome:
    """Static check + sandboxed verification of an external kernel; registered only if it
    passes (or, without its device, compiles)."""
    impl = add_external(s, path)
    verdict = run_verify(s, [impl], force=False, timeout_s=timeout_s, progress=progress)[0]
    outcome = AddOutcome(impl, verdict)
    if verdict.status in ("pass", "compiled"):
        register_external(s, impl, path)
        outcome.registered = True
    return outcome


def judge_added(s: Session, outcome: AddOutcome, roofline: object | None,
                progress: Callable[[str], None]) -> None:
    """Benchmark a registered kernel (when a roofline is given) and dispatch on each device
    it runs on: what `kernels add` shows after the verdict."""
    from strata.kernels import choose

    impl = outcome.impl
    if roofline is not None:
        outcome.figures = run_bench(s, [impl], roofline, shapes="llm", compile_=False,
                                    max_time_s=0.3, progress=progress)
    outcome.decisions = [choose(s.host, [impl.op], device)[impl.op].decision
                         for device in dict.fromkeys(filter(None, [outcome.verdict.device]))]
