"""Runtime guards around a candidate call inside the sandboxed worker: the timer must stay
the timer, no torch compute op may do the kernel's work, no work may continue after return.
"""

from __future__ import annotations

import threading
from typing import Any

from strata.kernels.checks import ASYNC_WRITE, CALLS_TORCH, LEFT_THREAD, PATCHED_TIMER, Failure

# Aten ops a kernel launcher may trigger without computing anything (views, allocation,
# moves — the Triton interpreter copies tensors to and from host buffers).
DATA_MOVEMENT_OPS = frozenset({
    "aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
    "aten.new_empty_strided", "aten.view", "aten._to_copy",
    "aten.copy_", "aten.detach", "aten.alias", "aten.as_strided", "aten.clone", "aten.t",
    "aten.transpose", "aten.reshape", "aten._reshape_alias", "aten.select", "aten.slice",
    "aten.unsqueeze", "aten.squeeze", "aten.expand", "aten.lift_fresh", "aten.contiguous",
    "aten.resolve_conj", "aten.resolve_neg", "aten._local_scalar_dense", "aten.is_nonzero",
    "aten.set_", "aten.permute", "aten.unbind", "aten.split", "aten.flatten",
})


def timer_identities() -> dict[str, Any]:
    """The objects every timing goes through; a kernel that swaps one of them is cheating."""
    import time

    import strata.hardware.devices as devices
    import strata.measure.timer as timer

    found: dict[str, Any] = {
        "time.perf_counter": time.perf_counter, "time.perf_counter_ns": time.perf_counter_ns,
        "time.monotonic": time.monotonic, "time.time": time.time,
        "timer.time_calls": timer.time_calls, "timer.time_once": timer.time_once,
        "timer.HostClock.measure": timer.HostClock.measure,
        "timer.CudaEventClock.measure": timer.CudaEventClock.measure,
        # the device runtime's sync, as the timer holds it and as devices.py exports it
        "timer.sync": timer.sync, "devices.sync": devices.sync,
    }
    try:
        import torch

        # read, never called (the one device sync is hardware/devices.py's): what the runtime
        # calls underneath, so a kernel that swaps it is caught too
        found["torch.cuda.synchronize"] = torch.cuda.synchronize
        found["torch.cuda.Event"] = torch.cuda.Event
    except ImportError:
        pass
    return found


def check_timer(expected: dict[str, Any]) -> Failure | None:
    now = timer_identities()
    patched = [name for name, obj in expected.items() if now.get(name) is not obj]
    if patched:
        return Failure(PATCHED_TIMER, f"the kernel replaced {', '.join(patched)}; timing and "
                       "harness objects are off limits")
    return None


class OpRecorder:
    """Records the aten ops run while active (torch's dispatch-mode hook)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore
                recorder.ops.add(str(func.overloadpacket))
                return func(*args, **(kwargs or {}))

        self.ops: set[str] = set()
        self._mode = _Mode()

    def __enter__(self) -> OpRecorder:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)

    def compute_ops(self) -> list[str]:
        return sorted(op for op in self.ops if op not in DATA_MOVEMENT_OPS)


def check_torch_ops(recorder: OpRecorder) -> Failure | None:
    ops = recorder.compute_ops()
    if ops:
        return Failure(CALLS_TORCH, f"the kernel called torch compute op(s) {', '.join(ops)}; "
                       "it must compute the op itself, not delegate to the vendor path")
    return None


def check_after_return(out: Any, snapshot: Any, threads_before: int) -> Failure | None:
    """Output must not change after the call returned, and no thread may be left running."""
    import time

    from strata.kernels.checks import same_values

    time.sleep(0.02)
    if not same_values(out, snapshot):
        return Failure(ASYNC_WRITE, "the output changed after the call returned: work "
                       "continued in the background (the timer would miss it)")
    if threading.active_count() > threads_before:
        return Failure(LEFT_THREAD, "the kernel left a thread running after it returned")
    return None
