"""What llama.cpp build this is: llama-bench's build and device fields, read from the ggml
libraries llama-cpp-python loaded (ctypes), and libllama's own version string."""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import llama_cpp.llama_cpp as lc

__all__ = ["build_info", "llama_cpp_version"]


def llama_cpp_version() -> str:
    """libllama's own version string (llama_version()), not the binding's."""
    fn = getattr(lc, "llama_version", None)
    if fn is None:
        return "unknown"
    try:
        raw = fn()
    except (AttributeError, OSError):  # symbol missing from this build of the library
        return "unknown"
    return raw.decode() if isinstance(raw, bytes) else str(raw)


@functools.cache
def build_info() -> dict[str, Any]:
    """llama-bench's build and device fields, read from the loaded ggml libraries.

    build_commit: ggml_commit(), the short hash of the llama.cpp checkout ggml was built from
    (llama.cpp's own LLAMA_COMMIT lives in common/build-info, which llama-cpp-python does not
    ship; both come from the same `git rev-parse`). A "-dirty" suffix (the binding patches its
    vendored tree) is dropped, as llama-bench's build_commit never has one; llama_cpp_commit
    keeps it. build_number: None, because no shipped library exports it and the binding's
    build clones shallowly (its build-info says 1 whatever the release).
    """
    from strata.backends.llamacpp import _init_once  # the loaded backend's one init

    _init_once()
    commit = _ggml_text("ggml_commit")
    return {
        "build_commit": commit.removesuffix("-dirty") if commit else None,
        "build_number": None,
        "llama_cpp_commit": commit,
        "ggml_version": _ggml_text("ggml_version"),
        **_devices(),
    }


def _ggml() -> Any:
    """libggml (with libggml-base beneath it) as llama-cpp-python loaded it."""
    try:
        from llama_cpp._ggml import libggml  # the binding's own handle: same process state

        return libggml
    except (ImportError, OSError, AttributeError):
        return lc._lib  # libllama's handle resolves ggml's symbols through its dependencies


def _ggml_text(symbol: str) -> str | None:
    try:
        fn = getattr(_ggml(), symbol)
    except AttributeError:  # an older ggml without this symbol
        return None
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    raw = fn()
    text = raw.decode("utf-8", "replace").strip() if raw else ""
    return None if text in ("", "unknown") else text


# ggml_backend_dev_type in ggml-backend.h
_DEV_CPU, _DEV_GPU, _DEV_IGPU, _DEV_ACCEL = 0, 1, 2, 3


def _devices() -> dict[str, str | None]:
    """cpu_info, gpu_info and backends exactly as llama-bench builds them: CPU and ACCEL
    device descriptions, GPU and IGPU device descriptions (joined ", "), and the registered
    backends other than CPU (joined ","; "CPU" when there is none)."""
    g = _ggml()
    try:
        sig = {"ggml_backend_dev_count": ([], ctypes.c_size_t),
               "ggml_backend_dev_get": ([ctypes.c_size_t], ctypes.c_void_p),
               "ggml_backend_dev_type": ([ctypes.c_void_p], ctypes.c_int),
               "ggml_backend_dev_description": ([ctypes.c_void_p], ctypes.c_char_p),
               "ggml_backend_reg_count": ([], ctypes.c_size_t),
               "ggml_backend_reg_get": ([ctypes.c_size_t], ctypes.c_void_p),
               "ggml_backend_reg_name": ([ctypes.c_void_p], ctypes.c_char_p)}
        fn = {}
        for name, (args, res) in sig.items():
            fn[name] = getattr(g, name)
            fn[name].argtypes, fn[name].restype = args, res
    except AttributeError:  # a ggml without the device registry: unknown, not guessed
        return {"cpu_info": None, "gpu_info": None, "backends": None}
    cpus, gpus = [], []
    for i in range(fn["ggml_backend_dev_count"]()):
        dev = fn["ggml_backend_dev_get"](i)
        text = (fn["ggml_backend_dev_description"](dev) or b"").decode("utf-8", "replace")
        kind = fn["ggml_backend_dev_type"](dev)
        if kind in (_DEV_CPU, _DEV_ACCEL):
            cpus.append(text)
        elif kind in (_DEV_GPU, _DEV_IGPU):
            gpus.append(text)
    names = [(fn["ggml_backend_reg_name"](fn["ggml_backend_reg_get"](i)) or b"").decode()
             for i in range(fn["ggml_backend_reg_count"]())]
    # llama-bench adds "RPC" only when RPC servers were given, which strata never does
    others = [n for n in names if n != "CPU" and not n.startswith("RPC")]
    return {"cpu_info": ", ".join(cpus), "gpu_info": ", ".join(gpus),
            "backends": ",".join(others) or "CPU"}
