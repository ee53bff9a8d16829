"""Compile C sources at run time into shared libraries, cached by content.

The cache key covers the source, the flags, the compiler's version and the host ISA, so a
library built for one machine is never loaded on another. Used by the probe's STREAM
kernels and, later, by the kernel lab's `c` dialect.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from strata.paths import cache_dir

DEFAULT_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


class CompileError(RuntimeError):
    """No compiler, or the source did not build; the message carries the compiler output."""


@dataclass(frozen=True)
class Compiler:
    path: str
    version: str


def find_compiler() -> Compiler:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        path = shutil.which(name) if name else None
        if path:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
            return Compiler(path, out.stdout.splitlines()[0] if out.stdout else "?")
    raise CompileError("no C compiler found (install gcc or clang, or set CC)")


def _host_isa_tag() -> str:
    from strata.hardware.cpu import probe_cpu

    cpu = probe_cpu()
    return f"{cpu.arch}:{cpu.model}:{','.join(cpu.isa)}"


def build_shared(source: Path, flags: tuple[str, ...] = DEFAULT_FLAGS,
                 out_dir: Path | None = None) -> Path:
    """Path to a shared library built from `source` with `flags`, compiling only when needed."""
    compiler = find_compiler()
    return build_with(compiler, source, (*flags,), ("-lm",), out_dir, _host_isa_tag())


def find_nvcc() -> Compiler:
    path = shutil.which("nvcc")
    if not path:
        raise CompileError("nvcc not found (install the CUDA toolkit or put nvcc on PATH)")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    lines = out.stdout.strip().splitlines()
    return Compiler(path, lines[-1] if lines else "?")


def build_cuda(source: Path, archs: tuple[str, ...], out_dir: Path | None = None) -> Path:
    """Shared library from a .cu file for the given sm_XY architectures (nvcc)."""
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    # The shared CUDA runtime (torch has it loaded already): a statically linked one would
    # bring its own dlopen/socket/file calls into the kernel's imports, which elfcheck
    # could then no longer tell apart from the kernel's. rpath: the toolkit's copy.
    toolkit_lib = Path(find_nvcc().path).resolve().parent.parent / "lib64"
    flags = ("-O3", "-shared", "-cudart", "shared", "-Xcompiler", "-fPIC",
             f"-Xlinker=-rpath,{toolkit_lib}", *gencode)
    return build_with(find_nvcc(), source, flags, (), out_dir, "cuda")


def build_with(compiler: Compiler, source: Path, flags: tuple[str, ...],
               libs: tuple[str, ...], out_dir: Path | None, target_tag: str) -> Path:
    """Compile once per (source, flags, compiler version, target); publish atomically."""
    text = source.read_bytes()
    key = hashlib.sha256(b"\0".join([text, " ".join(flags).encode(), compiler.version.encode(),
                                     target_tag.encode()])).hexdigest()[:16]
    out_dir = out_dir or cache_dir() / "native"
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"{source.stem.replace('.', '-')}-{key}.so"
    if lib.exists():
        return lib
    # atomic publish: concurrent builds (processes or threads) never clash
    tmp = lib.with_suffix(f".{os.getpid()}-{threading.get_ident()}.tmp")
    proc = subprocess.run([compiler.path, *flags, str(source), "-o", str(tmp), *libs],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise CompileError(f"{Path(compiler.path).name} failed on {source.name}: "
                           f"{proc.stderr.strip()[:2000]}")
    tmp.replace(lib)
    return lib


def load_shared(source: Path, flags: tuple[str, ...] = DEFAULT_FLAGS) -> ctypes.CDLL:
    return ctypes.CDLL(str(build_shared(source, flags)))
