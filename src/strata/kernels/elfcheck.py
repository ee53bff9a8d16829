"""What a compiled kernel may link to and run at load time, read from its ELF file before it
is ever loaded (issue: "a sandbox that holds").

Name-based source checks cannot stop a kernel that declares the functions it wants itself
(`int PyRun_SimpleString(const char *);` resolves against the Python process at `dlopen`).
So the shared object is judged by what it *imports*: every undefined dynamic symbol must be
on the allow-list of its dialect (libm, memory, the OpenMP runtime; the CUDA runtime's launch
and registration calls for `cuda`). Code that would run at load time, before any check can
observe it, is refused too: constructor entries beyond the ones the compiler itself emits
(measured by compiling an empty unit with the same toolchain), GNU indirect functions (their
resolvers run during relocation) and libraries the build did not ask for.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# libm and the few libc routines a numeric kernel needs; `f`/`l` variants are added below.
_MATH = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt", "pow",
         "tanh", "sinh", "cosh", "asinh", "acosh", "atanh", "sin", "cos", "tan", "asin",
         "acos", "atan", "atan2", "erf", "erfc", "fabs", "floor", "ceil", "round", "lround",
         "trunc", "fmod", "fmin", "fmax", "fma", "hypot", "ldexp", "frexp", "nearbyint",
         "rint", "lrint", "copysign", "tgamma", "lgamma", "sincos")
C_ALLOWED = frozenset({
    *_MATH, *(m + "f" for m in _MATH), *(m + "l" for m in _MATH),
    "memcpy", "memmove", "memset", "memcmp", "malloc", "calloc", "realloc", "free",
    "aligned_alloc", "posix_memalign", "abort", "__assert_fail", "__stack_chk_fail",
    "__errno_location", "__memcpy_chk", "__memset_chk", "__memmove_chk",
    # inserted by the compiler and the C runtime startup files, never called by kernel code
    "__gmon_start__", "_ITM_registerTMCloneTable", "_ITM_deregisterTMCloneTable",
    "__cxa_finalize",
    # the OpenMP runtime (its own thread pool: a kernel cannot start threads any other way)
    "omp_get_thread_num", "omp_get_num_threads", "omp_get_max_threads",
    "omp_get_num_procs", "omp_in_parallel",
})
C_ALLOWED_PREFIXES = ("GOMP_",)

# nvcc host code: the runtime's registration/launch entry points, the async allocator the
# split-K kernels use, attribute queries, and the C++ runtime pieces host code pulls in.
CUDA_ALLOWED = C_ALLOWED | frozenset({
    "cudaLaunchKernel", "cudaGetLastError", "cudaPeekAtLastError", "cudaFuncSetAttribute",
    "cudaFuncGetAttributes", "cudaGetDevice", "cudaDeviceGetAttribute",
    "cudaMallocAsync", "cudaFreeAsync", "cudaMemsetAsync", "cudaMemcpyAsync",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor", "cudaStreamGetCaptureInfo",
    "__cxa_atexit", "__cxa_guard_acquire", "__cxa_guard_release", "__cxa_guard_abort",
    "__gxx_personality_v0", "_Unwind_Resume", "_Znwm", "_Znam", "_ZdlPv", "_ZdaPv",
    "_ZdlPvm", "_ZdaPvm",
})
CUDA_ALLOWED_PREFIXES = ("GOMP_", "__cuda")

C_NEEDED = frozenset({"libc.so.6", "libm.so.6", "libgomp.so.1", "libmvec.so.1"})
CUDA_NEEDED = C_NEEDED | {"libstdc++.so.6", "libgcc_s.so.1"}
_CUDART = re.compile(r"^libcudart\.so(\.\d+)*$")

_IFUNC = "STT_LOOS"  # pyelftools' name for STT_GNU_IFUNC (10)
_IRELATIVE = {"EM_X86_64": 37, "EM_AARCH64": 1032}


@dataclass(frozen=True)
class Policy:
    allowed: frozenset[str]
    prefixes: tuple[str, ...]
    needed: frozenset[str]
    cudart: bool = False

    def symbol_ok(self, name: str) -> bool:
        return name in self.allowed or name.startswith(self.prefixes)

    def needed_ok(self, lib: str) -> bool:
        return lib in self.needed or (self.cudart and bool(_CUDART.match(lib)))


POLICIES = {
    "c": Policy(C_ALLOWED, C_ALLOWED_PREFIXES, C_NEEDED),
    "cuda": Policy(CUDA_ALLOWED, CUDA_ALLOWED_PREFIXES, frozenset(CUDA_NEEDED), cudart=True),
}


@dataclass
class ElfFacts:
    undefined: list[str] = field(default_factory=list)
    needed: list[str] = field(default_factory=list)
    init_entries: int = 0
    fini_entries: int = 0
    has_init: bool = False  # DT_INIT (the runtime's _init)
    ifuncs: list[str] = field(default_factory=list)
    irelative: int = 0


def _base_name(name: str) -> str:
    return name.split("@", 1)[0]


def read_facts(path: Path) -> ElfFacts:
    """Undefined dynamic symbols, DT_NEEDED, constructor counts and indirect functions."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection
    from elftools.elf.sections import SymbolTableSection

    facts = ElfFacts()
    with path.open("rb") as fh:
        elf = ELFFile(fh)
        word = 8 if elf.elfclass == 64 else 4
        irelative = _IRELATIVE.get(elf["e_machine"], -1)
        for sec in elf.iter_sections():
            if isinstance(sec, SymbolTableSection):
                for sym in sec.iter_symbols():
                    if sym["st_info"]["type"] == _IFUNC:
                        facts.ifuncs.append(sym.name)
                    if sec.name == ".dynsym" and sym.name and \
                            sym["st_shndx"] == "SHN_UNDEF":
                        facts.undefined.append(_base_name(sym.name))
            elif isinstance(sec, DynamicSection):
                for tag in sec.iter_tags():
                    if tag.entry.d_tag == "DT_NEEDED":
                        facts.needed.append(tag.needed)
                    elif tag.entry.d_tag == "DT_INIT":
                        facts.has_init = True
            elif isinstance(sec, RelocationSection):
                facts.irelative += sum(1 for r in sec.iter_relocations()
                                       if r["r_info_type"] == irelative)
            if sec.name in (".init_array", ".ctors"):
                facts.init_entries += sec["sh_size"] // word
            elif sec.name in (".fini_array", ".dtors"):
                facts.fini_entries += sec["sh_size"] // word
    return facts


def judge(facts: ElfFacts, policy: Policy, baseline: ElfFacts | None) -> list[str]:
    """Findings, most serious first; empty when the object may be loaded."""
    findings = []
    bad = sorted({s for s in facts.undefined if not policy.symbol_ok(s)})
    if bad:
        findings.append(f"links to {', '.join(bad[:8])}{' …' if len(bad) > 8 else ''}: a "
                        "kernel may only call libm, memory and OpenMP routines "
                        "(docs/kernels-abi.md)")
    if facts.ifuncs or facts.irelative:
        findings.append("defines an indirect function (ifunc): its resolver would run at "
                        "load time")
    if baseline is not None:
        extra_init = facts.init_entries - baseline.init_entries
        extra_fini = facts.fini_entries - baseline.fini_entries
        if extra_init > 0 or extra_fini > 0:
            findings.append(f"has {max(extra_init, 0)} constructor and {max(extra_fini, 0)} "
                            "destructor entr(ies) beyond the compiler's own: code that runs "
                            "at load/unload time")
    libs = [lib for lib in facts.needed if not policy.needed_ok(lib)]
    if libs:
        findings.append(f"needs the librar(ies) {', '.join(libs)}, which the build did not "
                        "ask for")
    return findings


@lru_cache(maxsize=8)
def _baseline(dialect: str, flags: tuple[str, ...]) -> ElfFacts:
    """What the toolchain itself puts in an object: compile a trivial unit with the same
    flags (one tiny build per dialect and flag set, cached on disk by content)."""
    from strata.native import build_cuda, build_shared
    from strata.paths import cache_dir

    folder = cache_dir() / "native" / "elf-baseline"
    folder.mkdir(parents=True, exist_ok=True)
    if dialect == "cuda":
        src = folder / "baseline.cu"
        _write_once(src, "__global__ void strata_baseline_k(float *x) { x[0] = 1.0f; }\n"
                       "extern \"C\" void strata_baseline(float *x) "
                       "{ strata_baseline_k<<<1, 1>>>(x); }\n")
        return read_facts(build_cuda(src, flags, folder))
    src = folder / "baseline.c"
    _write_once(src, "void strata_baseline(float *x, long n) {\n#pragma omp parallel for\n"
                   "for (long i = 0; i < n; i++) x[i] = 1.0f; }\n")
    return read_facts(build_shared(src, flags, folder))


def _write_once(path: Path, text: str) -> None:
    """Concurrent checks share the file: write it only when absent or different."""
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{threading.get_ident()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)


def check_library(path: Path, dialect: str, flags: tuple[str, ...]) -> list[str]:
    """Findings for a built kernel library (empty: it may be loaded)."""
    policy = POLICIES.get(dialect)
    if policy is None:
        return []
    try:
        facts = read_facts(path)
    except Exception as exc:  # not an ELF file: refuse rather than load it unchecked
        return [f"cannot read {path.name} as an ELF shared object ({exc})"]
    return judge(facts, policy, _baseline(dialect, flags))
