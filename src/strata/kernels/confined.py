"""Untrusted kernels in production: a kernel that did not ship with strata (added by hand or
written by a model) runs in its own confined worker (kernels/worker.py, the same confinement
as verification), never in the caller's process — unless the user promoted it with
`strata kernels trust NAME`.

Calls go through shared memory. A bound call (`bind`: the lab's decode reuses one set of
buffers per token) moves its tensors' storages to shared memory once (torch's
`share_memory_`, which swaps the storage in place, so every view of it follows) and maps them
into the worker — inputs read-only, so a confined kernel cannot change a model's weights —
after which each call is one round trip. A one-off call (`call`) moves large inputs the same
way and copies the rest through staging buffers (outputs copied back after "done").
"""

from __future__ import annotations

import atexit
import itertools
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from strata.kernels.impl import Implementation
from strata.kernels.process import KernelProcess, WorkerFailure, WorkerSpec
from strata.kernels.shm import Segment

PER_REQUEST_S = 600.0  # a confined call that takes longer is a hung kernel
SHARE_MIN_BYTES = 1 << 20  # inputs this large move to shared memory rather than being copied
MAX_SHARED = 1024  # storages mapped into the worker at once (least recently used dropped)
_SEG_IDS = itertools.count(1 << 30)  # distinct from the Arena's ids
_LIVE: weakref.WeakSet[ConfinedKernel] = weakref.WeakSet()


class ConfinedCallError(RuntimeError):
    """The confined kernel failed, hung or tried to escape during a production call."""


def _close_all() -> None:
    for kernel in list(_LIVE):
        kernel.close()


atexit.register(_close_all)


class ConfinedKernel:
    """A Kernel (`bind(out, inputs, params) -> thunk`) that runs in a confined worker."""

    def __init__(self, impl: Implementation, spec: Any, device: str) -> None:
        from strata.kernels.judge import worker_spec
        from strata.kernels.sandbox import CPU_ADDRESS_SPACE

        wspec: WorkerSpec = worker_spec(impl, device, PER_REQUEST_S,
                                        CPU_ADDRESS_SPACE if device == "cpu" else None)
        wspec.per_request = True
        self.spec, self.device = spec, device
        self.proc = KernelProcess(wspec)
        self.shared: OrderedDict[int, tuple[Segment, weakref.ref]] = OrderedDict()
        self.staging: dict[int, tuple[Segment, Any]] = {}
        self.binds: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self.calls = 0
        try:
            self.proc.start()
            self.kid = self.proc.load(spec.name, impl=impl.to_job())
        except WorkerFailure as exc:
            self.proc.close()
            raise ConfinedCallError(f"{impl.name}: the confined worker could not load it "
                                    f"({exc.failure.message})") from None
        _LIVE.add(self)

    # -- memory ------------------------------------------------------------------------------
    def _shared(self, t: Any) -> tuple[Segment, int]:
        """`t`'s storage in shared memory (moved there once), as a segment and offset.
        Entries hold their storage weakly: one the caller dropped is unmapped at the next
        sweep, and an address that a new storage took over is never read as the old one."""
        storage = t.untyped_storage()
        if not storage.is_shared():
            storage._share_fd_cpu_()  # in place: every view follows; the heap block is freed
        key = storage.data_ptr()
        found = self.shared.get(key)
        if found is not None and found[1]() is not storage:
            self._drop(key)
            found = None
        if found is None:
            fd, nbytes = storage._share_fd_cpu_()  # already shared: its descriptor
            seg = Segment(next(_SEG_IDS), fd, int(nbytes), None, key)  # type: ignore[arg-type]
            found = self.shared[key] = (seg, weakref.ref(storage))
            self._sweep()
        self.shared.move_to_end(key)
        return found[0], t.data_ptr() - key

    def _drop(self, key: int) -> None:
        """Unmap one storage's segment in the worker, with the bound calls on it (a bound
        call that finds its segment gone binds again)."""
        seg, _ = self.shared.pop(key)
        stale = [k for k in self.binds if any(a[0] == seg.id for a in k[0])]
        if stale:
            self.proc.request({"op": "unbind", "cids": [self.binds.pop(k) for k in stale]})
        self.proc.unmap([seg.id])

    def _sweep(self) -> None:
        for key in [k for k, (_, ref) in self.shared.items() if ref() is None]:
            self._drop(key)
        while len(self.shared) > MAX_SHARED:  # least recently used first
            self._drop(next(iter(self.shared)))

    def _staged(self, slot: int, t: Any) -> tuple[Segment, Any]:
        """A staging buffer for argument `slot`, grown to hold `t`; a tensor view over it."""
        import torch

        nbytes = t.numel() * t.element_size()
        have = self.staging.get(slot)
        if have is None or have[0].nbytes < nbytes:
            if have is not None:
                self.proc.unmap([have[0].id])
            seg = Segment.create(max(nbytes, 4096) * 2)
            flat = torch.frombuffer(seg.mm, dtype=torch.uint8, count=seg.nbytes)
            have = self.staging[slot] = (seg, flat)
        seg, flat = have
        return seg, flat[:nbytes].view(t.dtype).view(t.shape)

    # -- calls -------------------------------------------------------------------------------
    def _args(self, out: Any, inputs: list[Any], pin: bool) -> tuple[list[Any], Callable]:
        """(bind args, what to do after "done"): shared where the storage is or should be,
        staged (copied) otherwise."""
        args, copy_back = [], None
        for i, t in enumerate((out, *inputs)):
            big = t.numel() * t.element_size() >= SHARE_MIN_BYTES
            if pin or (i > 0 and big) or t.untyped_storage().data_ptr() in self.shared:
                seg, offset = self._shared(t)
                args.append((seg, offset))
                continue
            seg, view = self._staged(i, t)
            if i == 0:
                copy_back = (view, t)
            else:
                view.copy_(t)
            args.append((seg, 0))
        done = (lambda: copy_back[1].copy_(copy_back[0])) if copy_back else (lambda: None)
        return [(seg, off, str(t.dtype).replace("torch.", ""), list(t.shape))
                for (seg, off), t in zip(args, (out, *inputs), strict=True)], done

    def _cid(self, args: list[Any], out: Any, inputs: list[Any],
             params: dict[str, Any]) -> int:
        sizes = [int(n) for n in self.spec.sizes(out, *inputs)]
        floats = {k: float(v) for k, v in params.items()}
        key = (tuple((seg.id, off, dt, tuple(sh)) for seg, off, dt, sh in args),
               tuple(sizes), tuple(floats.items()))
        cid = self.binds.get(key)
        if cid is None:
            cid = self.binds[key] = self.proc.bind(self.kid, args, sizes, floats, writable=1)
            while len(self.binds) > 4 * MAX_SHARED:
                _, old = self.binds.popitem(last=False)
                self.proc.request({"op": "unbind", "cids": [old]})
        self.binds.move_to_end(key)
        return cid

    def _run(self, cid: int) -> None:
        try:
            self.proc.run([cid])
        except WorkerFailure as exc:
            raise ConfinedCallError(f"{self.spec.name}: the confined kernel failed "
                                    f"({exc.failure.reason}: {exc.failure.message})") from None
        self.calls += 1

    def bind(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> Callable[[], None]:
        """A prepared call: its tensors stay in shared memory, each call is a round trip
        (bound again, once, if its storages were evicted meanwhile)."""
        tensors = (out, *inputs)
        bound: dict[str, Any] = {}

        def prepare() -> None:
            args, bound["done"] = self._args(out, list(inputs), pin=True)
            bound["segs"] = [a[0].id for a in args]
            bound["cid"] = self._cid(args, out, list(inputs), params)

        def call() -> None:
            if any(s not in self.proc.mapped for s in bound["segs"]):
                prepare()
            self._run(bound["cid"])
            bound["done"]()

        prepare()
        call.tensors = tensors  # type: ignore[attr-defined]
        return call

    def call(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> None:
        args, done = self._args(out, list(inputs), pin=False)
        self._run(self._cid(args, out, list(inputs), params))
        done()

    def close(self) -> None:
        self.proc.close()
        for seg, _ in self.staging.values():
            seg.close()
        self.staging.clear()
        self.shared.clear()  # the storages keep their own descriptors
