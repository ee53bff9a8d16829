"""Smoke test runner: real subprocesses on this machine's CPU, real hangs, real error texts."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from strata.hardware.smoke import (
    FAILURE_CLASSES,
    Limits,
    check_outputs,
    classify_failure,
    error_summary,
    limits_for,
    parse_report,
    run_isolated,
    run_smoke,
)

posix_only = pytest.mark.skipif(os.name != "posix", reason="process groups and rlimits are POSIX")


def _torch_or_skip():
    return pytest.importorskip("torch")


# --- the real CPU ------------------------------------------------------------------------------


def test_cpu_smoke_float32_and_bfloat16_pass() -> None:
    _torch_or_skip()
    result = run_smoke("cpu", ["float32", "bfloat16"], timeout_s=120)
    assert result.ok, result.detail
    assert result.device == "cpu"
    assert result.dtypes_ok == ["float32", "bfloat16"]
    assert result.dtypes_failed == {}
    assert result.failure_class is None
    assert result.seconds is not None and 0 < result.seconds < 120


def test_cpu_smoke_with_an_unknown_dtype_is_partial() -> None:
    _torch_or_skip()
    result = run_smoke("cpu", ["float32", "int4"], timeout_s=120)
    assert not result.ok
    assert result.dtypes_ok == ["float32"]
    assert result.dtypes_failed == {"int4": "unsupported_dtype"}
    assert "int4" in result.detail


def test_gpu_device_string_without_a_gpu_is_classified_not_crashed() -> None:
    torch = _torch_or_skip()
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA/ROCm device")
    result = run_smoke("cuda:0", ["float32"], timeout_s=120)
    assert not result.ok
    assert result.failure_class == "no_device"
    assert "CUDA" in result.detail  # torch's own words, e.g. "Torch not compiled with CUDA enabled"
    assert result.dtypes_ok == []


def test_unknown_device_type_is_classified() -> None:
    _torch_or_skip()
    result = run_smoke("nosuchdevice:0", ["float32"], timeout_s=120)
    assert not result.ok
    assert result.failure_class == "no_device"
    assert "nosuchdevice" in result.detail


def test_child_without_torch_reports_no_torch() -> None:
    # -S drops site-packages, so this interpreter's torch is out of reach of the child.
    result = run_smoke("cpu", ["float32"], timeout_s=60, python=[sys.executable, "-S"])
    assert not result.ok
    assert result.failure_class == "no_torch"
    assert "No module named 'torch'" in result.detail


def test_worker_imports_this_strata_even_without_pythonpath(monkeypatch) -> None:
    # The child must import the very strata the parent runs, installed or not; with -S and no
    # PYTHONPATH only run_smoke's own path setup can make `-m strata.hardware.smoke` importable.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    result = run_smoke("cpu", ["float32"], timeout_s=60, python=[sys.executable, "-S"])
    assert result.failure_class == "no_torch", result.detail  # the worker ran and reported


# --- hangs, crashes and limits -----------------------------------------------------------------


@posix_only
def test_hanging_child_comes_back_as_timeout_quickly() -> None:
    started = time.monotonic()
    run = run_isolated("import time; time.sleep(120)", timeout_s=1.0)
    elapsed = time.monotonic() - started
    assert run.timed_out
    assert run.returncode == -signal.SIGKILL
    assert elapsed < 10


@posix_only
def test_timeout_also_kills_grandchildren_holding_the_pipes() -> None:
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    started = time.monotonic()
    run = run_isolated(code, timeout_s=2.0)
    assert run.timed_out
    assert time.monotonic() - started < 15
    grandchild = int(run.stdout.split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {grandchild} survived the timeout")


def test_hanging_smoke_worker_is_a_timeout_result() -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]  # ignores the worker args
    result = run_smoke("cpu", ["float32"], timeout_s=1.0, python=sleeper)
    assert not result.ok
    assert result.failure_class == "timeout"
    assert result.seconds is not None and result.seconds < 10


def test_dead_worker_stderr_is_classified() -> None:
    dies = [sys.executable, "-c",
            "import sys; sys.stderr.write('torch.AcceleratorError: CUDA error: no kernel image is "
            "available for execution on the device\\n'); sys.exit(1)"]
    result = run_smoke("cuda:0", ["float32"], timeout_s=30, python=dies)
    assert not result.ok
    assert result.failure_class == "missing_kernel_image"
    assert "no kernel image" in result.detail


@posix_only
def test_worker_killed_by_a_signal_says_which() -> None:
    crashes = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    result = run_smoke("cuda:0", ["float32"], timeout_s=30, python=crashes)
    assert not result.ok
    assert result.failure_class == "other"
    assert "SIGSEGV" in result.detail


@posix_only
def test_limits_are_applied_in_the_child() -> None:
    code = ("import resource as r; print(r.getrlimit(r.RLIMIT_AS)[0], "
            "r.getrlimit(r.RLIMIT_CPU)[0], r.getrlimit(r.RLIMIT_CORE)[0])")
    run = run_isolated(code, 30, limits=Limits(cpu_seconds=77, address_space_bytes=3 << 30))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(3 << 30), "77", "0"]


@posix_only
def test_address_space_limit_turns_a_big_allocation_into_out_of_memory() -> None:
    run = run_isolated("bytearray(4 << 30)", 30, limits=Limits(address_space_bytes=1 << 30))
    assert run.returncode != 0
    assert classify_failure(run.stderr) == "out_of_memory"


def test_only_the_cpu_smoke_gets_an_address_space_limit() -> None:
    # CUDA/ROCm map huge virtual ranges at init; an RLIMIT_AS would break them.
    assert limits_for("cpu", 60).address_space_bytes is not None
    for device in ("cuda:0", "mps", "xpu:0"):
        assert limits_for(device, 60).address_space_bytes is None
        assert limits_for(device, 60).cpu_seconds >= 60


def test_run_isolated_reports_a_missing_program() -> None:
    run = run_isolated(["/nonexistent/strata-no-such-binary"], 5)
    assert run.returncode is None and not run.timed_out
    assert "could not start" in run.stderr


# --- classifier --------------------------------------------------------------------------------

# Error texts as torch, the CUDA/HIP runtimes and NVML print them.
RECORDED_ERRORS = [
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
     "CUDA kernel errors might be asynchronously reported at some other API call, so the "
     "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1",
     "missing_kernel_image"),
    ("RuntimeError: HIP error: invalid device function\nHIP kernel errors might be "
     "asynchronously reported at some other API call", "invalid_device_function"),
    ("hipErrorInvalidDeviceFunction", "invalid_device_function"),
    ("ROCm error: invalid device function", "invalid_device_function"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
     "capacity of 79.11 GiB of which 3.06 MiB is free.", "out_of_memory"),
    ("RuntimeError: HIP out of memory. Tried to allocate 2.00 GiB", "out_of_memory"),
    ("RuntimeError: MPS backend out of memory (MPS allocated: 17.00 GB)", "out_of_memory"),
    ("RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
     "driver_mismatch"),
    ("RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please "
     "update your GPU driver", "driver_mismatch"),
    ("Failed to initialize NVML: Driver/library version mismatch", "driver_mismatch"),
    ("ModuleNotFoundError: No module named 'torch'", "no_torch"),
    ("AssertionError: Torch not compiled with CUDA enabled", "no_device"),
    ("RuntimeError: No CUDA GPUs are available", "no_device"),
    ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
     "GPU and installed a driver", "no_device"),
    ("torch.AcceleratorError: CUDA error: invalid device ordinal", "no_device"),
    ("TypeError: MPS BFloat16 is only supported on MacOS 14 or newer", "unsupported_dtype"),
    ("RuntimeError: \"arange_mps\" not implemented for 'BFloat16'", "unsupported_dtype"),
    ("ModuleNotFoundError: No module named 'torchvision'", "other"),
    ("Segmentation fault (core dumped)", "other"),
]


@pytest.mark.parametrize(("text", "expected"), RECORDED_ERRORS)
def test_classify_failure_on_recorded_texts(text: str, expected: str) -> None:
    assert classify_failure(text) == expected
    assert expected in FAILURE_CLASSES


def test_error_summary_picks_the_classified_line() -> None:
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n")
    assert error_summary(text).startswith("RuntimeError: CUDA error: no kernel image")
    assert error_summary("first\nlast line\n") == "last line"


def test_parse_report_finds_the_json_line_among_noise() -> None:
    out = 'warning: something\n{"device": "cpu", "dtypes": {}}\n{not json\n'
    assert parse_report(out) == {"device": "cpu", "dtypes": {}}
    assert parse_report("no json here") is None


# --- the numerical check (silent-NaN class) ---------------------------------------------------


def test_check_outputs_flags_nan_from_finite_inputs() -> None:
    torch = _torch_or_skip()
    ref = torch.ones(4, 4, dtype=torch.float64)
    out = torch.ones(4, 4, dtype=torch.bfloat16)
    out[1, 2] = float("nan")
    result = check_outputs({"matmul": (out, ref)}, "bfloat16")
    assert not result["ok"]
    assert result["class"] == "silent_nan"
    assert "matmul" in result["detail"]

    out[1, 2] = float("inf")
    assert check_outputs({"matmul": (out, ref)}, "bfloat16")["class"] == "silent_nan"


def test_check_outputs_tolerance_per_dtype() -> None:
    torch = _torch_or_skip()
    ref = torch.full((8,), 10.0, dtype=torch.float64)
    close = (ref + 0.05).to(torch.bfloat16)  # within bf16 rounding at 10.0
    assert check_outputs({"ew": (close, ref)}, "bfloat16")["ok"]
    assert check_outputs({"ew": ((ref + 0.05).float(), ref)}, "float32")["class"] == "wrong_result"
    assert check_outputs({"ew": (ref.float(), ref)}, "float32")["ok"]
