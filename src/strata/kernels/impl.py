"""Implementations: one source file each, declaring op, dialect, entry and requirements.

Built-in sources live under `kernels/sources/<dialect>/` and external ones are registered
with `strata kernels add`; both carry the same declaration line (docs/kernels-abi.md):

    // strata-kernel: op=rmsnorm dialect=c entry=strata_rmsnorm requires=avx2,fma

so nothing in core code names a particular implementation.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path

from strata.errors import InputError
from strata.kernels.capability import Requires

SOURCES = Path(__file__).resolve().parent / "sources"
# Headers the `c` kernels share (`strata_*.h` next to the built-in C sources): a source
# includes one by name, `#include "strata_simd.h"`, and the compiler finds it there (-iquote,
# dialects/c.py). Their bytes are part of each user's content hash (Implementation.headers).
C_HEADERS = SOURCES / "c"
SHARED_HEADER = re.compile(r"strata_\w+\.h")
_QUOTED_INCLUDE = re.compile(r'^[ \t]*(?:#|%:)[ \t]*include[ \t]*"([^"\n]+)"', re.M)
DECLARATION = re.compile(r"strata-kernel:\s*(?P<body>.*)$")
HEADER_LINES = 30
# Bump when the verification rules change: cached verdicts of older rules no longer count.
HARNESS_VERSION = "3"  # 2: ELF import check, confinement, prefills, canaries, threads;
# 3: judge in its own process, open OpenMP regions after a call


@dataclass(frozen=True)
class Implementation:
    op: str
    name: str  # unique per op: "c.avx2", "triton", "ext.my_rmsnorm"
    dialect: str
    source: Path | None  # None for the torch baselines
    entry: str
    requires: Requires
    dtypes: tuple[str, ...] = ("float32",)
    origin: str = "builtin"  # "builtin" | "external" | "baseline"
    notes: str = ""
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        return f"{self.op}/{self.name}"

    @property
    def specialisation(self) -> int:
        """How much of the CPU it asks for (ISA features required: AVX-512 VNNI variants
        above AVX2 above portable C). Among verified built-ins nobody has timed, the most
        specialised is the tuned one: first-use verification tries it first, dispatch
        serves it."""
        return len(self.requires.isa)

    @property
    def is_baseline(self) -> bool:
        return self.origin == "baseline"

    def headers(self) -> tuple[Path, ...]:
        """The shared headers (C_HEADERS) this source includes, directly or through another
        shared header, in name order; none for other dialects."""
        if self.source is None or self.dialect != "c":
            return ()
        return included_headers(self.source.read_text("utf-8", errors="replace"))

    def content_hash(self) -> str:
        """Identity of what is verified: source bytes, the bytes of every shared header it
        includes (editing one re-verifies its users), declaration, harness version and the
        op's verification cases (a spec that gains a shape or a clause re-verifies)."""
        h = hashlib.sha256(HARNESS_VERSION.encode())
        h.update(cases_digest(self.op).encode())
        h.update(f"{self.op}|{self.dialect}|{self.entry}|{self.requires.describe()}|"
                 f"{','.join(self.dtypes)}".encode())
        if self.source is not None:
            h.update(self.source.read_bytes())
            for header in self.headers():
                h.update(b"\0" + header.name.encode() + b"\0" + header.read_bytes())
        return h.hexdigest()[:16]

    def to_job(self) -> dict[str, object]:
        """What the sandboxed worker needs to rebuild this implementation."""
        return {"op": self.op, "name": self.name, "dialect": self.dialect,
                "source": str(self.source) if self.source else None, "entry": self.entry,
                "requires": self.requires.describe(), "dtypes": list(self.dtypes),
                "origin": self.origin, "extra": dict(self.extra)}

    @classmethod
    def from_job(cls, job: dict[str, object]) -> Implementation:
        src = job.get("source")
        return cls(op=str(job["op"]), name=str(job["name"]), dialect=str(job["dialect"]),
                   source=Path(str(src)) if src else None, entry=str(job["entry"]),
                   requires=Requires.parse(str(job["requires"])),
                   dtypes=tuple(job.get("dtypes") or ("float32",)),  # type: ignore[arg-type]
                   origin=str(job.get("origin", "builtin")),
                   extra={str(k): str(v) for k, v in
                          dict(job.get("extra") or {}).items()})  # type: ignore[call-overload]


@cache
def cases_digest(op: str) -> str:
    """What verification feeds `op`: its verify shapes, its clauses' cases and tolerances
    ("" for an op this strata does not know)."""
    from strata.kernels.spec import all_specs

    spec = all_specs().get(op)
    if spec is None:
        return ""
    cases = (spec.shapes.get("verify"), [(c.name, c.shape, c.seeds) for c in spec.clauses],
             sorted((k, (t.atol, t.rtol)) for k, t in spec.tolerances.items()))
    return hashlib.sha256(repr(cases).encode()).hexdigest()[:16]


def shared_header_names() -> frozenset[str]:
    """Names of the shared C headers (what `#include "..."` may name in any C kernel)."""
    return frozenset(p.name for p in C_HEADERS.glob("strata_*.h")
                     if SHARED_HEADER.fullmatch(p.name))


def included_headers(text: str) -> tuple[Path, ...]:
    """Shared headers a C text includes by name, transitively (a header may include
    another), as paths under C_HEADERS in name order. Other includes are not ours: the
    system's headers, or names the static check refuses for an external kernel."""
    names = shared_header_names()
    found: dict[str, Path] = {}
    todo = [text]
    while todo:
        for name in _QUOTED_INCLUDE.findall(todo.pop()):
            if name in names and name not in found:
                found[name] = C_HEADERS / name
                todo.append(found[name].read_text("utf-8", errors="replace"))
    return tuple(found[n] for n in sorted(found))


def parse_declaration(path: Path) -> dict[str, str]:
    """key=value pairs of the file's `strata-kernel:` line; InputError if there is none."""
    try:
        head = path.read_text("utf-8", errors="replace").splitlines()[:HEADER_LINES]
    except OSError as exc:
        raise InputError(f"FILE {path}: cannot read it ({exc.strerror})") from exc
    for line in head:
        m = DECLARATION.search(line)
        if m:
            pairs = [p.split("=", 1) for p in m.group("body").split() if "=" in p]
            return {k.strip().lower(): v.strip() for k, v in pairs}
    raise InputError(f"FILE {path}: no 'strata-kernel: op=... dialect=... entry=...' line in "
                     f"its first {HEADER_LINES} lines (see docs/kernels-abi.md)")


def from_source(path: Path, origin: str = "builtin", name: str | None = None) -> Implementation:
    from strata.kernels.dialects import get_dialect

    decl = parse_declaration(path)
    missing = [k for k in ("op", "dialect") if k not in decl]
    if missing:
        raise InputError(f"FILE {path}: declaration lacks {', '.join(missing)}")
    dialect = get_dialect(decl["dialect"], path)
    op = decl["op"]
    from strata.kernels.spec import all_specs

    if op not in all_specs():
        raise InputError(f"FILE {path}: op={op} is not a kernel-lab op (choose from "
                         f"{', '.join(all_specs())})")
    impl_name = name or decl.get("name") or variant_name(path, op, dialect.name)
    try:
        requires = dialect.requires(Requires.parse(decl.get("requires", ""),
                                                   dialect.default_device))
    except ValueError as exc:
        raise InputError(f"FILE {path}: requires=: {exc}") from exc
    dtypes = tuple(decl.get("dtypes", "float32").split(","))
    return Implementation(op=op, name=impl_name, dialect=dialect.name, source=path,
                          entry=decl.get("entry", dialect.default_entry(op)), requires=requires,
                          dtypes=dtypes, origin=origin, notes=decl.get("notes", ""))


def variant_name(path: Path, op: str, dialect: str) -> str:
    """`rmsnorm.avx2.c` -> "c.avx2"; `rmsnorm.py` -> "triton"; `matmul_bf16.cu` -> "cuda.bf16"."""
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    if stem == op:
        return dialect
    for sep in (".", "_"):
        if stem.startswith(op + sep):
            return f"{dialect}.{stem[len(op) + 1:]}"
    return f"{dialect}.{stem}"


@lru_cache(maxsize=1)
def builtin_implementations() -> tuple[Implementation, ...]:
    from strata.kernels.dialects import DIALECTS

    found = []
    for dialect in DIALECTS.values():
        folder = SOURCES / dialect.name
        for path in sorted(folder.glob("*")) if folder.is_dir() else []:
            if path.suffix in dialect.suffixes and not path.name.startswith("_"):
                found.append(from_source(path))
    return tuple(found)
