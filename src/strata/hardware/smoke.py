"""Smoke test: tiny ops per dtype on one device, run in a subprocess that cannot hang the probe.

Parent side (`run_smoke`) starts `python -m strata.hardware.smoke` with a wall-clock timeout
and resource limits, parses the one JSON line the worker prints, and when the worker dies
without one, classifies its stderr (`classify_failure`). The worker (`main`) imports torch,
runs an elementwise op and a 64x64 matmul per dtype on the device and compares both against a
float64 CPU reference computed from the same dtype-rounded inputs.

Why a subprocess: a GPU that the stack cannot drive may abort the process, hang in the driver
or poison the CUDA context for the rest of the probe.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from strata.hardware.profile import SmokeResult
from strata.launch import IsolatedRun, Limits, run_isolated, worker_env

__all__ = ["IsolatedRun", "Limits", "run_isolated", "run_smoke", "worker_env"]

# Failure classes (besides the text-classified ones below).
TIMEOUT = "timeout"
SILENT_NAN = "silent_nan"  # NaN/Inf out of finite inputs, no error raised
WRONG_RESULT = "wrong_result"  # finite but outside the dtype tolerance
OTHER = "other"

# Ordered registry: the first pattern that matches names the class. Texts are what torch,
# the CUDA/HIP runtimes and NVML really print (see tests/test_smoke.py for recorded samples).
FAILURE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE)) for name, pattern in (
        ("no_torch", r"No module named '?torch'?(?![\w.])"),
        ("missing_kernel_image", r"no kernel image is available for execution on the device"
                                 r"|cudaErrorNoKernelImageForDevice|CUDA_ERROR_NO_BINARY_FOR_GPU"),
        ("invalid_device_function", r"hipErrorInvalidDeviceFunction|invalid device function"
                                    r"|hipErrorNoBinaryForGpu|HSA_STATUS_ERROR_INVALID_ISA"),
        ("driver_mismatch", r"driver version is insufficient|cudaErrorInsufficientDriver"
                            r"|Driver/library version mismatch|NVML library version mismatch"
                            r"|NVIDIA driver on your system is too old"
                            r"|unsupported display driver / cuda driver combination"
                            r"|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH|cudaErrorSystemDriverMismatch"),
        ("out_of_memory", r"out of memory|OutOfMemoryError|hipErrorOutOfMemory|MemoryError"
                          r"|UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|Cannot allocate memory"),
        ("no_device", r"not compiled with \w+ enabled|No CUDA GPUs are available"
                      r"|Found no NVIDIA driver on your system|no ROCm-capable device"
                      r"|invalid device ordinal|device type at start of device string"
                      r"|MPS backend is not available|hipErrorNoDevice|cudaErrorNoDevice"),
        ("unsupported_dtype", r"BFloat16 is only supported on MacOS 14"
                              r"|does not have support for that dtype"
                              r"|not implemented for '(?:BFloat16|Half|Float8\w*)'"),
    )
)
FAILURE_CLASSES = (*(name for name, _ in FAILURE_PATTERNS), TIMEOUT, SILENT_NAN, WRONG_RESULT,
                   OTHER)

# Worker exit codes (the JSON line is authoritative; these only help when it is missing).
EXIT_OK, EXIT_DTYPE_FAILED, EXIT_DEVICE_FAILED, EXIT_NO_TORCH = 0, 1, 2, 3

_DETAIL_CHARS = 300


def classify_failure(text: str) -> str:
    """Failure class of an error text (stderr of a dead worker, an exception message)."""
    for name, pattern in FAILURE_PATTERNS:
        if pattern.search(text or ""):
            return name
    return OTHER


def error_summary(text: str) -> str:
    """The most telling line of an error text: the one the classifier matched, else the last."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    for _, pattern in FAILURE_PATTERNS:
        for line in lines:
            if pattern.search(line):
                return line[:_DETAIL_CHARS]
    return lines[-1][:_DETAIL_CHARS] if lines else ""


# ---------------------------------------------------------------------------------------------
# Parent side of the smoke test

# Devices whose runtimes map huge virtual ranges (UVM, device apertures): an address-space
# limit breaks their initialisation, so only the CPU smoke test gets one.
_ADDRESS_SPACE_LIMIT = {"cpu": 16 << 30}


def limits_for(device: str, timeout_s: float) -> Limits:
    """Limits for smoke-testing `device`: generous enough for `import torch`."""
    kind = device.split(":", 1)[0].strip().lower()
    return Limits(cpu_seconds=int(max(60.0, 4 * timeout_s)),
                  address_space_bytes=_ADDRESS_SPACE_LIMIT.get(kind))


def worker_argv(device: str, dtypes: Sequence[str], python: Sequence[str] | None = None,
                ) -> list[str]:
    return [*(python or [sys.executable]), "-m", "strata.hardware.smoke",
            "--device", device, "--dtypes", ",".join(dtypes)]


def run_smoke(device: str, dtypes: list[str], timeout_s: float = 60.0, *,
              python: Sequence[str] | None = None) -> SmokeResult:
    """Smoke-test `device` ('cpu', 'cuda:0', 'mps', 'xpu:0') in each dtype, in a subprocess.

    `python` is the interpreter command (default: this one); pointing it at another
    environment smoke-tests that environment's torch.
    """
    started = time.perf_counter()
    run = run_isolated(worker_argv(device, dtypes, python), timeout_s, env=worker_env(),
                       limits=limits_for(device, timeout_s))
    return smoke_from_run(device, run, timeout_s, time.perf_counter() - started)


def parse_report(stdout: str) -> dict[str, Any] | None:
    """The worker's JSON line (the last line that parses as an object)."""
    for line in reversed((stdout or "").splitlines()):
        if line.lstrip().startswith("{"):
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(report, dict):
                return report
    return None


def smoke_from_run(device: str, run: IsolatedRun, timeout_s: float, seconds: float) -> SmokeResult:
    """Turn a finished worker run into a SmokeResult."""
    if run.timed_out:
        return SmokeResult(device=device, ok=False, failure_class=TIMEOUT, seconds=seconds,
                           detail=f"no answer within {timeout_s:g} s; worker killed")
    report = parse_report(run.stdout)
    if report is None:
        text = f"{run.stderr}\n{run.stdout}"
        return SmokeResult(device=device, ok=False, failure_class=classify_failure(text),
                           detail=_death_detail(run), seconds=seconds)
    return _from_report(device, report, run, seconds)


def _death_detail(run: IsolatedRun) -> str:
    summary = error_summary(run.stderr) or error_summary(run.stdout)
    code = run.returncode
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return f"worker killed by {name}" + (f": {summary}" if summary else "")
    return summary or f"worker exited with code {code} and no report"


def _from_report(device: str, report: dict[str, Any], run: IsolatedRun,
                 seconds: float) -> SmokeResult:
    dtypes: dict[str, dict[str, Any]] = report.get("dtypes") or {}
    ok_list = [name for name, r in dtypes.items() if r.get("ok")]
    failed = {name: r.get("class") or OTHER for name, r in dtypes.items() if not r.get("ok")}
    failure_class = report.get("failure_class")
    details = [report.get("detail") or ""]
    details += [f"{name}: {r.get('detail', '')}" for name, r in dtypes.items() if not r.get("ok")]
    if run.returncode not in (EXIT_OK, EXIT_DTYPE_FAILED, EXIT_DEVICE_FAILED, EXIT_NO_TORCH):
        # Results were printed, then the process died (seen at driver teardown): keep both.
        details.append(_death_detail(run))
    ok = failure_class is None and not failed and bool(ok_list)
    return SmokeResult(device=device, ok=ok, dtypes_ok=ok_list, dtypes_failed=failed,
                       failure_class=failure_class, detail="; ".join(d for d in details if d),
                       seconds=seconds)


# ---------------------------------------------------------------------------------------------
# Worker side (runs in the child; imports torch)

# |out - ref| <= atol + rtol * |ref|. The reference uses the same dtype-rounded inputs in
# float64, so only the op's own rounding/accumulation shows; float32 leaves room for TF32.
TOLERANCES: dict[str, tuple[float, float]] = {  # dtype -> (rtol, atol)
    "float64": (1e-9, 1e-9),
    "float32": (1e-3, 1e-3),
    "float16": (1e-2, 3e-2),
    "bfloat16": (2e-2, 1e-1),
}
MATMUL_SIZE = 64


def _exception_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def check_outputs(outputs: dict[str, tuple[Any, Any]], dtype_name: str) -> dict[str, Any]:
    """Compare device outputs with float64 references: NaN/Inf first, then the tolerance.

    `outputs` maps an op name to (output tensor on CPU, float64 reference tensor).
    """
    import torch

    rtol, atol = TOLERANCES[dtype_name]
    worst = 0.0
    for op, (out, ref) in outputs.items():
        if not bool(torch.isfinite(out).all()):
            # The silent-NaN class: finite inputs, no exception, NaN/Inf out.
            return {"ok": False, "class": SILENT_NAN,
                    "detail": f"{op} returned NaN/Inf from finite {dtype_name} inputs"}
        err = (out.to(torch.float64) - ref).abs()
        excess = err - (atol + rtol * ref.abs())
        if bool((excess > 0).any()):
            detail = f"{op} off by up to {float(err.max()):.3g} (rtol {rtol}, atol {atol})"
            return {"ok": False, "class": WRONG_RESULT, "detail": detail}
        worst = max(worst, float(err.max()))
    return {"ok": True, "class": None, "detail": "", "max_abs_err": worst}


def check_dtype(torch: Any, device: str, dtype_name: str) -> dict[str, Any]:
    """Elementwise op and a small matmul in `dtype_name` on `device`, checked against float64."""
    dtype = getattr(torch, dtype_name, None) if dtype_name in TOLERANCES else None
    if dtype is None:
        return {"ok": False, "class": "unsupported_dtype",
                "detail": f"smoke test knows no dtype {dtype_name!r} ({', '.join(TOLERANCES)})"}
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=gen, dtype=torch.float64).to(dtype)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=gen, dtype=torch.float64).to(dtype)
    try:
        a_dev, b_dev = a.to(device), b.to(device)
        elementwise = (a_dev * 1.5 + 0.25).cpu()  # .cpu() also synchronises the device
        matmul = (a_dev @ b_dev).cpu()
    except Exception as exc:  # the device's own error text is the evidence we classify
        text = _exception_text(exc)
        return {"ok": False, "class": classify_failure(text), "detail": error_summary(text)}
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return check_outputs({"elementwise": (elementwise, a64 * 1.5 + 0.25),
                          "matmul": (matmul, a64 @ b64)}, dtype_name)


def _emit(report: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata.hardware.smoke",
                                     description="strata smoke-test worker (prints one JSON line)")
    parser.add_argument("--device", required=True)
    parser.add_argument("--dtypes", default="float32")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"device": args.device, "python": sys.executable, "dtypes": {},
                              "failure_class": None, "detail": ""}
    try:
        import torch
    except ImportError as exc:
        report.update(failure_class="no_torch",
                      detail=f"torch is not importable by {sys.executable}: {exc}")
        _emit(report)
        return EXIT_NO_TORCH
    report["torch"] = torch.__version__
    try:
        torch.ones(1, device=args.device).cpu()  # fails fast when the device is unreachable
    except Exception as exc:
        text = _exception_text(exc)
        report.update(failure_class=classify_failure(text), detail=error_summary(text))
        _emit(report)
        return EXIT_DEVICE_FAILED
    for name in filter(None, (d.strip() for d in args.dtypes.split(","))):
        report["dtypes"][name] = check_dtype(torch, args.device, name)
    _emit(report)
    return EXIT_OK if all(r["ok"] for r in report["dtypes"].values()) else EXIT_DTYPE_FAILED


if __name__ == "__main__":
    sys.exit(main())
