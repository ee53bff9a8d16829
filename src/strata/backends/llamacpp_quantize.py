"""llama.cpp's own quantizer (`llama_model_quantize`, what `llama-quantize` runs): a GGUF
re-stored at one of llama.cpp's mixes, with llama.cpp's per-tensor rules and block
arithmetic — the files people download, made here from an f16/f32 GGUF."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from strata.backends.base import BackendUnavailable
from strata.errors import InputError


def quantize_gguf(src: Path, dst: Path, ftype: int, threads: int | None = None) -> None:
    """Write `dst`: `src` quantised to llama.cpp's file type `ftype` (LLAMA_FTYPE). llama.cpp's
    log goes to strata's quiet logger (STRATA_LLAMA_LOG=1 shows it); a failure is one line
    with llama.cpp's own reason."""
    try:
        import llama_cpp.llama_cpp as lc

        from strata.backends.llamacpp import _LOG, _init_once
    except (ImportError, BackendUnavailable) as exc:
        raise InputError(f"quantising {src.name} needs llama.cpp's quantizer: install "
                         "llama-cpp-python (pip install 'strata[llamacpp]')") from exc
    _init_once()
    params = lc.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads or os.cpu_count() or 1
    rc = lc.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        why = _LOG.last_error() or f"code {rc}"
        raise InputError(f"llama.cpp could not quantise {src.name}: {why}")


def quantizer_version() -> str:
    """The llama.cpp build that quantises (its rules and rounding can change between
    versions, so cached files made by one are keyed by it)."""
    try:
        from strata.backends.llamacpp_info import llama_cpp_version
    except ImportError:
        return "absent"
    return llama_cpp_version()
