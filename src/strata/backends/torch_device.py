"""Where and in what dtype the torch backend runs: device strings checked against what this
torch build can drive, and the dtype rule (a CPU without a fast half path computes in
float32)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.backends.base import BackendUnavailable
from strata.errors import InputError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "f32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "f16": torch.float16, "fp16": torch.float16,
}


# Storage types (safetensors / GGUF spelling) -> the float dtype they stand for.
_STORED = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


_HALF = (torch.float16, torch.bfloat16)


# CPU ISA features (strata.hardware.cpu names) with native bf16 arithmetic.
_NATIVE_BF16 = {"avx512_bf16", "amx_bf16", "bf16"}


# A float32 copy of a half checkpoint must leave room for activations, cache and the OS.
_FP32_RAM_FRACTION = 0.5


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve_device(spec: str) -> torch.device:
    """'cpu' / 'cuda' / 'cuda:N' / 'mps' -> a usable torch.device, or BackendUnavailable."""
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        raise InputError(f"--device {spec}: unknown device (use cpu, cuda, cuda:N or "
                         "mps)") from None
    if device.type == "cuda":
        _check_cuda(spec, device)
    elif device.type == "mps":
        _check_mps(spec)
    elif device.type != "cpu":
        raise InputError(f"--device {spec}: the torch backend runs on cpu, cuda or mps")
    return device


def _check_cuda(spec: str, device: torch.device) -> None:
    if torch.version.cuda is None and torch.version.hip is None:
        raise BackendUnavailable(f"torch: device {spec} unavailable: PyTorch {torch.__version__} "
                                 "was built without CUDA/ROCm support")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise BackendUnavailable(f"torch: device {spec} unavailable: no CUDA device visible "
                                 "(driver missing or CUDA_VISIBLE_DEVICES empty)")
    if device.index is not None and device.index >= count:
        raise BackendUnavailable(f"torch: device {spec} unavailable: only {count} CUDA "
                                 f"device(s) visible")


def _check_mps(spec: str) -> None:
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_built():
        raise BackendUnavailable(f"torch: device {spec} unavailable: PyTorch "
                                 f"{torch.__version__} was built without MPS support")
    if not mps.is_available():
        raise BackendUnavailable(f"torch: device {spec} unavailable: MPS needs macOS 12.3+ on "
                                 "Apple silicon or an AMD GPU")


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    rule: str  # why this dtype, in words (reported by info())


def choose_dtype(requested: str, device: torch.device, checkpoint: torch.dtype,
                 checkpoint_bytes: int, cpu_isa: set[str] | None = None,
                 ram_available: int | None = None) -> DtypeChoice:
    """The dtype to run in.

    Explicit: as asked. "auto" on cuda/mps: the checkpoint's dtype. "auto" on CPU:
      float32 checkpoint          -> float32;
      float16/bfloat16 checkpoint -> bfloat16 where the CPU has native bf16 arithmetic
                                     (AVX512-BF16, AMX-BF16, Arm BF16) — same bytes per weight;
                                  -> float32 elsewhere, because PyTorch's CPU half kernels
                                     emulate half precision there (3-5x slower than float32
                                     on an AVX2 machine) — unless the float32 copy would take
                                     over half the available RAM, then bfloat16.
    """
    key = requested.lower()
    if key != "auto":
        if key not in DTYPES:
            raise InputError(f"--dtype {requested}: unknown dtype (use auto, float32, bfloat16 "
                             "or float16)")
        return DtypeChoice(DTYPES[key], f"{_name(DTYPES[key])} as requested")
    if device.type != "cpu" or checkpoint not in _HALF:
        return DtypeChoice(checkpoint, f"auto: the checkpoint's {_name(checkpoint)}")
    return _cpu_half_choice(checkpoint, checkpoint_bytes, cpu_isa, ram_available)


def _cpu_half_choice(checkpoint: torch.dtype, checkpoint_bytes: int, cpu_isa: set[str] | None,
                     ram_available: int | None) -> DtypeChoice:
    ckpt = _name(checkpoint)
    if cpu_isa is None or ram_available is None:
        from strata.hardware.cpu import probe_cpu

        cpu = probe_cpu()
        cpu_isa = set(cpu.isa) if cpu_isa is None else cpu_isa
        ram_available = cpu.ram_available_bytes if ram_available is None else ram_available
    native = sorted(cpu_isa & _NATIVE_BF16)
    if native:
        return DtypeChoice(torch.bfloat16, f"auto: {ckpt} checkpoint on a CPU with native bf16 "
                                           f"({', '.join(native)}) -> bfloat16")
    fp32_bytes = checkpoint_bytes * 2
    if ram_available and fp32_bytes > _FP32_RAM_FRACTION * ram_available:
        return DtypeChoice(torch.bfloat16, f"auto: {ckpt} checkpoint, CPU without native bf16, "
                                           f"but a float32 copy ({fp32_bytes / 2**30:.1f} GiB) "
                                           "would not fit in RAM -> bfloat16 (slow here)")
    return DtypeChoice(torch.float32, f"auto: {ckpt} checkpoint on a CPU without native "
                                      "bf16/fp16 arithmetic -> float32 (PyTorch emulates half "
                                      "precision there; float32 is faster)")
