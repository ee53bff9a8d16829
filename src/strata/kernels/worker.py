"""A kernel's process: `python -m strata.kernels.worker --fd N --config JSON`.

It executes calls on shared-memory buffers and nothing else (docs/architecture.md §7): the
judge — the process that started it — prepares every input, reads every output and canary
from shared memory, times the calls with its own clock and decides. An untrusted worker
confines itself (kernels/confine.py: Landlock, seccomp, the audit hook) before any kernel
code is loaded. Replies carry no trusted data: "done", or an error; a forged "done" is caught
because the judge checks the buffers itself. What the worker reports against the kernel
(an audit-hook violation, a torch op a Python launcher ran) can only fail it.

Messages (kernels/ipc.py; one JSON object each, descriptors alongside):
  map {seg, nbytes, write} + fd     map a segment (read-only unless `write`)
  unmap {segs}                      drop segments
  load {kid, impl | baseline, op}   load a kernel (or a torch baseline), once
  bind {cid, kid, args, sizes, params}
                                    args: [seg, offset, dtype, shape] for out, then inputs
  unbind {cids}
  stage {cids, to}                  GPU: copy the calls' segments to ("device") or back from
                                    ("host") the device mirrors; a no-op on the CPU
  run {cids, threads, record}       call each bound kernel in order, then synchronise
  flush {nbytes}                    touch a buffer larger than the last-level cache
  ping                              a null request (the channel's own round trip)
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import traceback
from collections.abc import Callable
from typing import Any

from strata.kernels import confine, ipc
from strata.kernels.shm import Mapping
from strata.kernels.threads import OpenRegions

# The audit guard of this worker (None for trusted workers); armed before kernel code loads.
AUDIT: confine.AuditGuard | None = None


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


class Server:
    def __init__(self, sock: Any, device: str) -> None:
        self.sock, self.device = sock, device
        self.maps: dict[int, Mapping] = {}
        self.kernels: dict[int, Any] = {}
        self.calls: dict[int, Callable[[], Any]] = {}
        self.call_segs: dict[int, list[int]] = {}
        self.mirrors: dict[int, Any] = {}  # GPU: segment -> device bytes
        self.flush_buf: Any = None
        self.omp: Any = None
        self.omp_regions: OpenRegions | None = None  # libgomp, once a kernel linked it

    # -- memory ------------------------------------------------------------------------------
    def h_map(self, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        if len(fds) != 1:
            return {"error": "map needs one descriptor"}
        seg = int(msg["seg"])
        self.maps[seg] = Mapping.open(fds[0], int(msg["nbytes"]), bool(msg["write"]))
        return {"ok": True}

    def h_unmap(self, msg: dict[str, Any], _fds: list[int]) -> dict[str, Any]:
        for seg in msg["segs"]:
            self.mirrors.pop(int(seg), None)
            mapping = self.maps.pop(int(seg), None)
            if mapping is not None:
                # a tensor view may still hold it: then it is freed with the view
                with contextlib.suppress(BufferError):
                    mapping.mm.close()
        return {"ok": True}

    def _tensor(self, seg: int, offset: int, dtype: str, shape: list[int]) -> Any:
        import torch

        mapping = self.maps[seg]
        t_dtype = _torch_dtype(dtype)
        numel = 1
        for n in shape:
            numel *= int(n)
        nbytes = numel * torch.empty((), dtype=t_dtype).element_size()
        if self.device != "cpu":
            dev = self._mirror(seg)
            return dev[offset:offset + nbytes].view(t_dtype).view(tuple(shape))
        raw = (ctypes.c_char * mapping.nbytes).from_address(mapping.address)
        with _quiet():
            flat = torch.frombuffer(raw, dtype=torch.uint8, count=mapping.nbytes)
        return flat[offset:offset + nbytes].view(t_dtype).view(tuple(shape))

    def _mirror(self, seg: int) -> Any:
        import torch

        if seg not in self.mirrors:
            self.mirrors[seg] = torch.empty(self.maps[seg].nbytes, dtype=torch.uint8,
                                            device=self.device)
        return self.mirrors[seg]

    def _host(self, seg: int) -> Any:
        import torch

        mapping = self.maps[seg]
        raw = (ctypes.c_char * mapping.nbytes).from_address(mapping.address)
        with _quiet():
            return torch.frombuffer(raw, dtype=torch.uint8, count=mapping.nbytes)

    def h_stage(self, msg: dict[str, Any], _fds: list[int]) -> dict[str, Any]:
        if self.device == "cpu":
            return {"ok": True}
        segs = {s for cid in msg["cids"] for s in self.call_segs.get(int(cid), [])}
        for seg in sorted(segs):
            if msg["to"] == "device":
                self._mirror(seg).copy_(self._host(seg))
            elif self.maps[seg].writable:
                self._host(seg).copy_(self._mirror(seg).cpu())
        _sync(self.device)
        return {"ok": True}

    # -- kernels ---------------------------------------------------------------------------
    def h_load(self, msg: dict[str, Any], _fds: list[int]) -> dict[str, Any]:
        kid = int(msg["kid"])
        if "baseline" in msg:
            self.kernels[kid] = Baseline(msg["opname"], msg["baseline"])
        else:
            self.kernels[kid] = load_kernel(msg["impl"], msg["opname"], self.device)
            if self.omp_regions is None:  # looked up here, not inside a timed run
                from strata.kernels.threads import open_regions

                self.omp_regions = open_regions()
        return {"ok": True}

    def h_bind(self, msg: dict[str, Any], _fds: list[int]) -> dict[str, Any]:
        kernel = self.kernels[int(msg["kid"])]
        args = msg["args"]
        cid = int(msg["cid"])
        self.call_segs[cid] = sorted({int(a[0]) for a in args})
        if isinstance(kernel, CEntry) and self.device == "cpu":
            self.calls[cid] = kernel.bind_pointers(
                [self.maps[int(s)].address + int(off) for s, off, _, _ in args],
                msg["sizes"], msg["params"])
            return {"ok": True}
        tensors = [self._tensor(int(s), int(off), dt, sh) for s, off, dt, sh in args]
        self.calls[cid] = kernel.bind(tensors[0], tensors[1:], dict(msg["params"]))
        return {"ok": True}

    def h_unbind(self, msg: dict[str, Any], _fds: list[int]) -> dict[str, Any]:
        for cid in msg["cids"]:
            self.calls.pop(int(cid), None)
            self.call_segs.pop(int(cid), None)
        return {"ok": True}

    def h_run(self, msg: dict[str, Any], _fds: list[int]) -> dict[str, Any]:
        threads = msg.get("threads")
        thunks = [self.calls[int(c)] for c in msg["cids"]]
        recorder = _recorder() if msg.get("record") else None
        with self._threads(threads):
            if recorder is None:
                open_region = _call_all(thunks, self.omp_regions)
            else:
                with recorder:
                    open_region = _call_all(thunks, self.omp_regions)
        _sync(self.device)
        reply: dict[str, Any] = {"done": len(thunks)}
        if open_region:
            reply["open_region"] = open_region
        if recorder is not None:
            reply["torch_ops"] = recorder.compute_ops()
        return reply

    def _threads(self, n: int | None) -> Any:
        from contextlib import nullcontext

        if n is None:
            return nullcontext()
        if self.omp is None:
            from strata.kernels.threads import ThreadControl

            self.omp = ThreadControl.for_dialect("c")
        return self.omp.limit(int(n))

    def h_flush(self, msg: dict[str, Any], _fds: list[int]) -> dict[str, Any]:
        import numpy as np

        if self.device != "cpu":
            from strata.kernels.timing import flusher

            if self.flush_buf is None:
                self.flush_buf = flusher(self.device, 0)  # 2x the GPU's L2
            self.flush_buf()
            return {"ok": True}
        n = max(1, int(msg["nbytes"]) // 4)
        if self.flush_buf is None or self.flush_buf.size != n:
            self.flush_buf = np.zeros(n, dtype=np.float32)
        np.add(self.flush_buf, 1.0, out=self.flush_buf)  # one thread: no team left spinning
        return {"ok": True}

    def h_ping(self, _msg: dict[str, Any], _fds: list[int]) -> dict[str, Any]:
        return {"ok": True}

    # -- the loop --------------------------------------------------------------------------
    def serve(self) -> int:
        handlers = {"map": self.h_map, "unmap": self.h_unmap, "load": self.h_load,
                    "bind": self.h_bind, "unbind": self.h_unbind, "stage": self.h_stage,
                    "run": self.h_run, "flush": self.h_flush, "ping": self.h_ping}
        while True:
            try:
                msg, fds = ipc.recv(self.sock)
            except ipc.ChannelClosed:
                return 0
            op = msg.get("op")
            if op == "exit":
                return 0
            try:
                reply = handlers[str(op)](msg, fds)
            except Exception as exc:  # the kernel's failure (or a bad request): say it
                reply = {"error": _one_line(exc),
                         "trace": traceback.format_exc().splitlines()[-5:]}
            if AUDIT is not None and AUDIT.violations:
                reply["violations"] = AUDIT.violations[:5]
            ipc.send(self.sock, reply)


class CEntry:
    """A C-ABI function: pointers, int64 sizes, float params (docs/kernels-abi.md)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def bind_pointers(self, pointers: list[int], sizes: list[int],
                      params: dict[str, float]) -> Callable[[], Any]:
        args = [*(ctypes.c_void_p(p) for p in pointers), *(ctypes.c_int64(int(n)) for n in sizes),
                *(ctypes.c_float(float(v)) for v in params.values())]
        fn = self.fn
        fn.argtypes = [type(a) for a in args]

        def call() -> None:
            fn(*args)

        return call

    def bind(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> Callable[[], Any]:
        raise RuntimeError("a C kernel is bound by pointers")


class Baseline:
    """The vendor path (torch eager or torch.compile) of an op: trusted workers only."""

    def __init__(self, op: str, name: str) -> None:
        from strata.kernels.spec import get_spec

        self.spec, self.name = get_spec(op), name

    def bind(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> Callable[[], Any]:
        import functools

        fn = functools.partial(self.spec.vendor(), **params)
        if self.name == "torch.compile":
            import torch

            fn = torch.compile(fn, dynamic=False)
            fn(*inputs)  # compile outside the timed region; raises where compile cannot
        return functools.partial(fn, *inputs)


def load_kernel(job: dict[str, Any], op: str, device: str) -> Any:
    """Load a kernel; from here on the audit guard watches (untrusted workers)."""
    from strata.kernels.impl import Implementation

    impl = Implementation.from_job(job)
    if AUDIT is not None:
        AUDIT.arm()
    if impl.dialect == "c" and impl.extra.get("library"):
        lib = ctypes.CDLL(impl.extra["library"])
        fn = getattr(lib, impl.entry, None)
        if fn is None:
            raise LookupError(f"{impl.source.name if impl.source else impl.name} defines no "
                              f"function {impl.entry}")
        fn.restype = None
        return CEntry(fn)
    from strata.kernels.dialects import get_dialect
    from strata.kernels.spec import get_spec

    spec = get_spec(op)
    if AUDIT is None or impl.dialect != "triton":
        return get_dialect(impl.dialect).load(impl, spec, device)
    AUDIT.python_kernel = True  # the module's top level is kernel code
    try:
        return _Watched(get_dialect(impl.dialect).load(impl, spec, device), AUDIT)
    finally:
        AUDIT.python_kernel = False


class _Watched:
    """A Python kernel whose calls run with the audit guard's native-code rule on."""

    def __init__(self, kernel: Any, audit: confine.AuditGuard) -> None:
        self.kernel, self.audit = kernel, audit

    def bind(self, out: Any, inputs: list[Any], params: dict[str, Any]) -> Any:
        audit = self.audit
        audit.python_kernel = True
        try:
            inner = self.kernel.bind(out, inputs, params)
        finally:
            audit.python_kernel = False

        def call() -> None:
            audit.python_kernel = True
            try:
                inner()
            finally:
                audit.python_kernel = False

        return call


def _call_all(thunks: list[Callable[[], Any]], regions: OpenRegions | None) -> int:
    """Call in order; stop at a call that returned inside OpenMP regions it opened, join
    them and return how many (0: every call closed what it opened)."""
    for thunk in thunks:
        thunk()
        if regions is not None and regions.level() > 0:
            return regions.close()
    return 0


def _recorder() -> Any:
    from strata.kernels.guards import OpRecorder

    return OpRecorder()


def _sync(device: str) -> None:
    if device == "cpu":
        return
    from strata.hardware.vendors import runtime_for

    runtime_for(device).sync(device)


class _quiet:
    """torch.frombuffer warns about read-only buffers: the worker knows."""

    def __enter__(self) -> None:
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(*exc)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 1500 else text[:1500] + "…"


def _confine(config: dict[str, Any]) -> dict[str, Any] | None:
    """Confine this process before anything of the kernel's is loaded (untrusted)."""
    global AUDIT
    if not config.get("confine"):
        return None
    plan = confine.Plan.from_job(config["confine"])
    applied = confine.confine(plan)
    AUDIT = confine.AuditGuard(plan.scratch, allow_spawn=plan.gpu,
                               refuse_native=bool(config.get("python_kernels"))
                               and not plan.gpu).install()
    return applied.to_dict()


def _prepare(config: dict[str, Any]) -> None:
    """Import what the harness needs before the audit guard is armed (imports open files
    and probe libraries; none of that is the kernel's doing)."""
    if config.get("torch"):
        import torch  # noqa: F401

        import strata.kernels.guards
        import strata.kernels.spec
    if config.get("python_kernels"):
        try:
            import triton
            import triton.language  # noqa: F401
        except ImportError:
            pass
        import strata.kernels.dialects
    if config.get("device", "cpu") != "cpu":
        import strata.hardware.vendors  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    import socket

    parser = argparse.ArgumentParser(prog="strata.kernels.worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--config", default="{}")
    args = parser.parse_args(argv)
    config = json.loads(args.config)
    sock = socket.socket(fileno=args.fd)
    try:
        # Still one thread: Landlock and seccomp bind the calling thread and what it starts
        # later, so they come before any import that could start a thread.
        sandbox = _confine(config)
        _prepare(config)
    except Exception as exc:
        ipc.send(sock, {"error": f"the worker could not start: {_one_line(exc)}"})
        return 1
    ipc.send(sock, {"ready": True, "sandbox": sandbox})
    return Server(sock, config.get("device", "cpu")).serve()


if __name__ == "__main__":
    # `python -m` runs this file as __main__, a second copy of the module: run the one that
    # the dialects import, so there is one AUDIT guard.
    from strata.kernels import worker

    raise SystemExit(worker.main())
