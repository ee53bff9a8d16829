"""The kernel lab: verified, benchmarked kernels per hardware dialect, with dispatch.

`strata.kernels.get(op)` returns the fastest verified implementation for this host and
device (or the torch reference, reported as a fallback) together with its decision trace.
The `strata kernels` commands as functions: `implementations()` (list), `verify()`,
`add(path)`, `remove(name)`; `abi_path()` is the kernel ABI document shipped with strata.
Heavy pieces (torch, compilers, the DB) load lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strata.kernels.dispatch import Decision
    from strata.kernels.spec import KernelSpec


@dataclass
class Choice:
    """A dispatched op: call it like the kernel ABI, `choice(out, *inputs, **params)`."""

    decision: Decision
    spec: KernelSpec
    _kernel: Any = None
    _checked: bool = False
    caps: Any = None  # HostCaps, to build a confined kernel (None: this host's, probed)
    # the KernelHost to verify an external kernel on demand at a shape it was never verified
    # at; None: such calls take the vendor path
    host: Any = None
    _shapes: dict[tuple[Any, ...], bool] = field(default_factory=dict)
    shaped: bool = False  # resolved for one call shape (a per-shape op's sub-choice)
    _by_shape: dict[tuple[Any, ...], Choice] = field(default_factory=dict)

    def for_call(self, out: Any, inputs: tuple[Any, ...]) -> Choice:
        """The Choice that serves this call: itself, or for an op dispatched per call shape
        (spec.per_shape: convolutions) the decision resolved at the call's shape, once per
        shape, from the benchmarks at that shape (its trace says so)."""
        if not self.spec.per_shape or self.shaped or self.host is None or \
                self.spec.dims is None:
            return self
        shape = self.spec.dims(out, *inputs)
        key = tuple(sorted(shape.items()))
        if key not in self._by_shape:
            from strata.kernels.dispatch import resolve

            self._by_shape[key] = Choice(resolve(self.spec.name, self.decision.device,
                                                 self.host, shape), self.spec,
                                         caps=self.caps, host=self.host, shaped=True)
        return self._by_shape[key]

    @property
    def is_fallback(self) -> bool:
        return self.decision.outcome == "fallback"

    def _params(self, params: dict[str, Any]) -> dict[str, Any]:
        from strata.errors import InputError
        from strata.kernels.contract import check_params, param_names

        check_params(self.spec, params)
        merged = {**self.spec.params, **params}
        names = param_names(self.spec)
        missing = [k for k in names if merged.get(k) is None]
        if missing:
            raise InputError(f"{self.spec.name}: pass {', '.join(missing)}=")
        return {k: merged[k] for k in names}  # the ABI's order, whatever the caller's

    @property
    def confined(self) -> bool:
        """True when the chosen kernel runs in its own confined worker: an external kernel
        the user has not promoted with `strata kernels trust` (docs/architecture.md §7)."""
        impl = self.decision.impl
        if impl is None:
            return False
        flag = getattr(self.decision, "confined", None)
        return bool(flag) if flag is not None else impl.origin == "external"

    def _load(self) -> Any:
        """The chosen kernel: built-ins and trusted kernels in this process, untrusted ones
        in a confined worker (their code never runs here)."""
        if self._kernel is None:
            impl = self.decision.impl
            if self.confined:
                from strata.kernels.confined import ConfinedKernel

                self._kernel = ConfinedKernel(_ready(impl, self.caps), self.spec,
                                               self.decision.device)
            else:
                from strata.kernels.dialects import get_dialect

                self._kernel = get_dialect(impl.dialect).load(impl, self.spec,
                                                              self.decision.device)
        return self._kernel

    def serves(self, out: Any, inputs: tuple[Any, ...]) -> bool:
        """Whether the chosen kernel may serve a call on these tensors. An external kernel
        serves only within the shapes it was verified and benchmarked at (per dim, margin
        0); outside, it is verified on demand at that shape (sandboxed, stored) when this
        Choice knows its host, else the call takes the vendor path. The decision's trace
        says which, once per shape."""
        decision = self.decision
        if decision.impl is None:
            return True
        if self.confined and decision.device != "cpu":
            return self._no_gpu_confinement()
        if decision.coverage is None:
            return True
        dims = getattr(self.spec, "dims", None)
        shape = dims(out, *inputs) if callable(dims) else None
        key = tuple(sorted(shape.items())) if shape else ("unknown",)
        if key not in self._shapes:
            self._shapes[key] = self._cover(shape)
        return self._shapes[key]

    def _no_gpu_confinement(self) -> bool:
        """A confined worker serves CPU calls only (shared memory is host memory): an
        untrusted GPU kernel waits for `strata kernels trust`; the vendor path serves."""
        from strata.kernels.dispatch import TraceEntry

        if ("gpu",) not in self._shapes:
            self._shapes[("gpu",)] = False
            self.decision.trace.append(TraceEntry(
                self.decision.impl.name, "fallback", "an untrusted kernel runs confined, and "
                "confined calls are CPU-only (shared host memory): the vendor path serves; "
                f"strata kernels trust {self.decision.impl.name} runs it in-process"))
        return False

    def _cover(self, shape: dict[str, int] | None) -> bool:
        from strata.kernels.dispatch import TraceEntry

        decision, impl = self.decision, self.decision.impl
        why = decision.uncovered(shape) if shape else "the op cannot name a call's shape"
        if why is None:
            return True
        if shape and self.host is not None:
            from strata.kernels.verify import verify_at

            verdict = verify_at(impl, shape, self.host)
            ok = verdict.passed
            text = f"{why}: verified on demand at it ({verdict.status}" + \
                (f": {verdict.reason}: {verdict.message})" if not ok else ")")
            if not ok:
                text += "; the vendor path serves"
            decision.trace.append(TraceEntry(impl.name, "verified on demand", text))
            return ok
        decision.trace.append(TraceEntry(impl.name, "fallback", f"{why}: the vendor path "
                                         "serves calls at this shape"))
        return False

    def _run(self, out: Any, inputs: tuple[Any, ...], merged: dict[str, Any]) -> None:
        if not self.serves(out, inputs):
            out.copy_(self.spec.vendor()(*inputs, **merged).reshape(out.shape))
            return
        kernel = self._load()
        if self.confined:
            kernel.call(out, list(inputs), merged)
        else:
            kernel.bind(out, list(inputs), merged)()

    def __call__(self, out: Any, *inputs: Any, **params: Any) -> Any:
        """Compute the op into `out`. Every tensor must be contiguous, on the decision's
        device, of the kinds and ranks the op takes (docs/kernels-abi.md) and, for a chosen
        kernel, of a dtype it declares; `out` must have the shape the inputs give. Anything
        else raises InputError naming the argument — no copy is made behind your back."""
        from strata.kernels.contract import check_call

        target = self.for_call(out, inputs)
        if target is not self:
            return target(out, *inputs, **params)
        merged = self._params(params)
        impl = self.decision.impl
        check_call(self.spec, out, inputs, merged, impl.dtypes if impl else None,
                   self.decision.device)
        if impl is None:  # vendor path or fallback: the torch op, written into `out`
            return out.copy_(self.spec.vendor()(*inputs, **merged))
        self._run(out, inputs, merged)
        return out

    def run_packed(self, out: Any, *inputs: Any, **params: Any) -> Any:
        """For callers that lay out their own arguments on every call (strata.train): `out`
        is flat (packed outputs, docs/kernels-abi.md). The full contract check runs on the
        first call; later calls, built the same way, skip its per-call cost."""
        from strata.kernels.contract import check_call

        target = self.for_call(out, inputs)
        if target is not self:
            return target.run_packed(out, *inputs, **params)
        merged = self._params(params)
        impl = self.decision.impl
        if not self._checked:  # the inputs' contract; the caller sized the flat `out`
            check_call(self.spec, out, inputs, merged, impl.dtypes if impl else None,
                       self.decision.device, out_shape=False)
            self._checked = True
        if impl is None:
            return out.copy_(self.spec.vendor()(*inputs, **merged).reshape(out.shape))
        self._run(out, inputs, merged)
        return out

    def bound(self, out: Any, *inputs: Any, **params: Any) -> Callable[[], Any]:
        """A call with everything prepared: the contract is checked now, the kernel loaded
        and bound to these tensors, so each later call is just the kernel on whatever the
        tensors then hold (a decode step reuses one set of buffers per token). The thunk
        keeps the tensors alive; do not resize or replace them. For a confined kernel the
        tensors' storages move to shared memory (once, in place) and each call is one round
        trip to its worker."""
        from strata.kernels.contract import check_call

        target = self.for_call(out, inputs)
        if target is not self:
            return target.bound(out, *inputs, **params)
        merged = self._params(params)
        impl = self.decision.impl
        check_call(self.spec, out, inputs, merged, impl.dtypes if impl else None,
                   self.decision.device)
        if impl is None or not self.serves(out, inputs):
            vendor = self.spec.vendor()
            return lambda: out.copy_(vendor(*inputs, **merged).reshape(out.shape))
        return self._load().bind(out, list(inputs), merged)

    def close(self) -> None:
        """Stop a confined kernel's worker (it also stops when the process exits), and those
        of the per-shape choices."""
        if self.confined and self._kernel is not None:
            self._kernel.close()
            self._kernel = None
        for sub in self._by_shape.values():
            sub.close()


def _ready(impl: Any, caps: Any) -> Any:
    """`impl` built and import-checked in this process (the worker may not run a
    compiler), with what the worker needs to load it."""
    from strata.kernels.dialects.base import prepared

    if caps is None:
        from strata.host import this_host
        from strata.paths import default_db_path
        from strata.store import open_db

        caps = this_host(open_db(default_db_path())).caps
    return prepared(impl, caps)


def choose(host: Any, ops: list[str] | tuple[str, ...], device: str) -> dict[str, Choice]:
    """op -> Choice on `device` of `host` (a KernelHost: strata.host.Host, a kernel
    session, a RecordedHost): what `get`, the -B lab backend and training dispatch through."""
    from strata.kernels.dispatch import resolve
    from strata.kernels.spec import get_spec

    return {op: Choice(resolve(op, device, host), get_spec(op), caps=host.caps, host=host)
            for op in ops}


def get(op: str, device: str = "cpu", db: Path | None = None) -> Choice:
    """The implementation dispatch picks for `op` on `device`, with its decision trace."""
    from strata.host import this_host
    from strata.paths import default_db_path
    from strata.store import open_db

    return choose(this_host(open_db(db or default_db_path())), [op], device)[op]


def _session(db: Path | None) -> Any:  # -> strata.kernels.service.Session
    from strata.kernels.service import session

    return session(db=db)


def implementations(op: str | None = None, db: Path | None = None) -> Any:
    """`strata kernels list`: one dict per implementation of `op` (None: every op) with
    op, impl, dialect, requires, available (here), verified (this host's verdict or "-"),
    speedup over torch eager (geomean over shapes, with its range) and origin (builtin or
    external). A list that renders as a table in a notebook (`.to_pandas()`)."""
    from strata.frame import Records
    from strata.kernels.service import list_records

    return Records(list_records(_session(db), op), LIST_COLUMNS, "strata kernels list")


LIST_COLUMNS = ("op", "impl", "dialect", "requires", "available", "verified", "speedup",
                "origin", "trust")


def verify(op: str | None = None, impl: str | None = None, *, force: bool = False,
           timeout_s: float = 300.0, db: Path | None = None) -> list[Any]:
    """`strata kernels verify`: prove implementations of `op` (or one, `impl` such as
    "c.avx2") correct in the sandbox; returns one Verdict per implementation (`.status`
    pass, fail or compiled; `.to_dict()`). Verdicts are stored and reused per source."""
    from strata.frame import Records
    from strata.kernels.service import run_verify, select

    s = _session(db)
    verdicts = run_verify(s, select(op, impl, s.conn), force=force, timeout_s=timeout_s,
                          progress=lambda _m: None)
    return Records(verdicts, (), "strata kernels verify", lambda v: v.to_dict())


def add(path: str | Path, *, timeout_s: float = 300.0, db: Path | None = None) -> Any:
    """`strata kernels add --no-bench`: static check and sandboxed verification of an
    external kernel source (its declaration line follows `abi_path()`); registered for
    dispatch only if it passes. Returns the outcome (`.registered`, `.verdict`, `.impl`)."""
    from strata.kernels.service import add_kernel

    return add_kernel(_session(db), Path(path), timeout_s=timeout_s, progress=lambda _m: None)


def remove(name: str, db: Path | None = None) -> list[Any]:
    """`strata kernels remove`: undo `add` for implementation `name` ("c.ext.my_rmsnorm" or
    "rmsnorm/c.ext.my_rmsnorm"): registration, stored results and the private copy of its
    source. InputError for a built-in kernel or a name never added."""
    from strata.kernels.service import remove_kernel
    from strata.paths import default_db_path
    from strata.store import open_db

    return remove_kernel(open_db(db or default_db_path()), name)


def abi_path() -> Path:
    """The kernel ABI (Markdown) installed with strata: each op's inputs, output and
    parameters, each dialect's calling convention, what a kernel may link to."""
    from strata.kernels.service import abi_path as path

    return path()


__all__ = ["Choice", "abi_path", "add", "choose", "get", "implementations", "remove",
           "verify"]
