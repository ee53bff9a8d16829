"""The kernel lab: verified, benchmarked kernels per hardware dialect, with dispatch.

`strata.kernels.get(op)` returns the fastest verified implementation for this host and
device (or the torch reference, reported as a fallback) together with its decision trace.
Heavy pieces (torch, compilers, the DB) load lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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

    @property
    def is_fallback(self) -> bool:
        return self.decision.outcome == "fallback"

    def _params(self, params: dict[str, Any]) -> dict[str, Any]:
        from strata.errors import InputError
        from strata.kernels.contract import check_params, param_names

        check_params(self.spec, params)
        merged = {**self.spec.params, **params}
        missing = [k for k in param_names(self.spec) if merged.get(k) is None]
        if missing:
            raise InputError(f"{self.spec.name}: pass {', '.join(missing)}=")
        return merged

    def __call__(self, out: Any, *inputs: Any, **params: Any) -> Any:
        """Compute the op into `out`. Every tensor must be contiguous, on the decision's
        device, of the kinds and ranks the op takes (docs/kernels-abi.md) and, for a chosen
        kernel, of a dtype it declares; `out` must have the shape the inputs give. Anything
        else raises InputError naming the argument — no copy is made behind your back."""
        from strata.kernels.contract import check_call

        merged = self._params(params)
        impl = self.decision.impl
        check_call(self.spec, out, inputs, merged, impl.dtypes if impl else None,
                   self.decision.device)
        if impl is None:  # vendor path or fallback: the torch op, written into `out`
            return out.copy_(self.spec.vendor()(*inputs, **merged))
        if self._kernel is None:
            from strata.kernels.dialects import get_dialect

            self._kernel = get_dialect(impl.dialect).load(impl, self.spec,
                                                          self.decision.device)
        self._kernel.bind(out, list(inputs), merged)()
        return out

    def run_packed(self, out: Any, *inputs: Any, **params: Any) -> Any:
        """For callers that lay out their own arguments on every call (strata.train): `out`
        is flat (packed outputs, docs/kernels-abi.md). The full contract check runs on the
        first call; later calls, built the same way, skip its per-call cost."""
        from strata.kernels.contract import check_call

        merged = self._params(params)
        impl = self.decision.impl
        if not self._checked:  # the inputs' contract; the caller sized the flat `out`
            check_call(self.spec, out, inputs, merged, impl.dtypes if impl else None,
                       self.decision.device, out_shape=False)
            self._checked = True
        if impl is None:
            return out.copy_(self.spec.vendor()(*inputs, **merged).reshape(out.shape))
        if self._kernel is None:
            from strata.kernels.dialects import get_dialect

            self._kernel = get_dialect(impl.dialect).load(impl, self.spec,
                                                          self.decision.device)
        self._kernel.bind(out, list(inputs), merged)()
        return out


    def bound(self, out: Any, *inputs: Any, **params: Any) -> Callable[[], Any]:
        """A call with everything prepared: the contract is checked now, the kernel loaded
        and bound to these tensors, so each later call is just the kernel on whatever the
        tensors then hold (a decode step reuses one set of buffers per token). The thunk
        keeps the tensors alive; do not resize or replace them."""
        from strata.kernels.contract import check_call

        merged = self._params(params)
        impl = self.decision.impl
        check_call(self.spec, out, inputs, merged, impl.dtypes if impl else None,
                   self.decision.device)
        if impl is None:
            vendor = self.spec.vendor()
            return lambda: out.copy_(vendor(*inputs, **merged).reshape(out.shape))
        if self._kernel is None:
            from strata.kernels.dialects import get_dialect

            self._kernel = get_dialect(impl.dialect).load(impl, self.spec,
                                                          self.decision.device)
        return self._kernel.bind(out, list(inputs), merged)


def get(op: str, device: str = "cpu", db: Path | None = None) -> Choice:
    """The implementation dispatch picks for `op` on `device`, with its decision trace."""
    from strata.host import this_host
    from strata.kernels.dispatch import resolve
    from strata.kernels.spec import get_spec
    from strata.paths import default_db_path
    from strata.store import open_db

    host = this_host(open_db(db or default_db_path()))
    return Choice(resolve(op, device, host.conn, host.fingerprint, host.caps), get_spec(op))


__all__ = ["Choice", "get"]
