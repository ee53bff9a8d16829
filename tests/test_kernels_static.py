"""Static checks on external kernel sources (strata.kernels.static_check): what a kernel has
no business doing is flagged before anything runs; ordinary kernel code is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.kernels.static_check import check_source

C_HEAD = "#include <stdint.h>\n#include <stdlib.h>\n"
ADVERSARIAL = Path(__file__).parent / "fixtures" / "kernels" / "adversarial"


def _check(tmp_path: Path, text: str, dialect: str) -> list[str]:
    path = tmp_path / ("kernel.py" if dialect == "triton" else "kernel.c")
    path.write_text(text)
    return check_source(path, dialect, "silu_mul")


def _c_kernel(body: str, head: str = "") -> str:
    return (f"{C_HEAD}{head}\nvoid strata_silu_mul(float *out, const float *a, const float *b,"
            f" int64_t n) {{\n{body}\n}}\n")


# -- C -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("head", "body", "word"), [
    ("#include <pthread.h>\nstatic void *go(void *p) { return p; }",
     "pthread_t t; pthread_create(&t, 0, go, 0);", "pthread_create"),
    ("#include <stdio.h>", "FILE *f = fopen(\"/etc/passwd\", \"r\"); (void)f;", "fopen"),
    ("", "struct timespec ts; clock_gettime(0, &ts);", "clock_gettime"),
    ("", "system(\"true\");", "system"),
    ("", "__asm__ volatile(\"nop\");", "asm"),
    ("", "cublasSgemm(0, 0, 0, 0, 0, 0);", "cublasSgemm"),
])
def test_c_cheats_are_flagged(tmp_path: Path, head: str, body: str, word: str) -> None:
    findings = _check(tmp_path, _c_kernel(body, head), "c")
    assert any(word in f for f in findings), findings


@pytest.mark.parametrize("header", ["<cblas.h>", "<mkl.h>", "<torch/extension.h>",
                                    '"Python.h"'])
def test_c_vendor_headers_are_flagged(tmp_path: Path, header: str) -> None:
    findings = _check(tmp_path, _c_kernel("", f"#include {header}"), "c")
    assert any("vendor library" in f for f in findings), findings


@pytest.mark.parametrize("header", ["<cublas_v2.h>", "<cublas.h>", "<cublasLt.h>", "<cudnn.h>"])
def test_cuda_vendor_headers_are_flagged(tmp_path: Path, header: str) -> None:
    findings = _check(tmp_path, _c_kernel("", f"#include {header}"), "c")
    assert any("vendor library" in f for f in findings), findings


def test_clean_c_kernel_with_openmp_and_malloc_passes(tmp_path: Path) -> None:
    body = """    float *tmp = (float *)malloc((size_t)n * sizeof(float));
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) tmp[i] = a[i] / (1.0f + expf(-a[i]));
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = tmp[i] * b[i];
    free(tmp);"""
    assert _check(tmp_path, _c_kernel(body, "#include <math.h>\n#include <omp.h>"), "c") == []


def test_comments_and_string_literals_are_not_code(tmp_path: Path) -> None:
    body = """    // never fopen(...) here
    /* nor system("rm -rf /") or
       clock_gettime() */
    const char *why = "no fopen(), no pthread_create()";
    (void)why;
    for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i];"""
    assert _check(tmp_path, _c_kernel(body), "c") == []


def test_comment_opener_inside_a_string_cannot_hide_code(tmp_path: Path) -> None:
    body = """    const char *p = "/*";
    FILE *f = fopen("/etc/passwd", "r");
    const char *q = "*/";
    (void)p; (void)q; (void)f;"""
    findings = _check(tmp_path, _c_kernel(body, "#include <stdio.h>"), "c")
    assert any("fopen" in f for f in findings), findings


@pytest.mark.parametrize("call", [
    "_rdtsc()", "__rdtsc()", "__rdtscp(&aux)", "_rdtscp(&aux)", "__builtin_ia32_rdtsc()",
    "__builtin_ia32_rdtscp(&aux)", "__builtin_readcyclecounter()",
    "__builtin_readsteadycounter()", "_rdpmc(0)", "__builtin_ia32_rdpmc(0)",
])
def test_c_timer_intrinsics_are_flagged(tmp_path: Path, call: str) -> None:
    """Cycle counters import no symbol (the ELF check cannot see them): named, they are
    refused; immintrin.h itself stays allowed (AVX2 needs it)."""
    body = f"    unsigned aux; unsigned long long t = {call}; (void)t; (void)aux;"
    findings = _check(tmp_path, _c_kernel(body, "#include <immintrin.h>"), "c")
    name = call.split("(")[0]
    assert any(f"{name} — reads a cycle counter" in f for f in findings), findings


def test_c_timer_intrinsic_taken_by_address_is_flagged(tmp_path: Path) -> None:
    body = "    unsigned long long (*t)(void) = __rdtsc; (void)t;"
    findings = _check(tmp_path, _c_kernel(body, "#include <x86intrin.h>"), "c")
    assert any("__rdtsc" in f for f in findings), findings


def test_c_token_pasting_is_flagged(tmp_path: Path) -> None:
    head = "#define CAT(a, b) a##b"
    findings = _check(tmp_path, _c_kernel("    (void)CAT(__rd, tsc)();", head), "c")
    assert any("## — pastes tokens" in f for f in findings), findings


def _cuda_kernel(body: str, head: str = "") -> str:
    return (f"#include <stdint.h>\n{head}\n__global__ void k(float *out, int64_t n) {{\n"
            f"{body}\n}}\n")


@pytest.mark.parametrize(("body", "word"), [
    ('    long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));',
     "%%globaltimer"),
    ('    long long t; asm volatile("mov.u64 %0, %%global" "timer;" : "=l"(t));',
     "%%globaltimer"),
    ('    long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));', "%%clock64"),
    ('    unsigned lo, hi; asm volatile("rdtsc" : "=a"(lo), "=d"(hi));', "rdtsc"),
    ('    asm volatile(".byte 0x0f, 0x31");', ".byte"),
    ('    asm volatile("syscall");', "syscall"),
    ("    long long t = clock64(); (void)t;", "clock64"),
], ids=["globaltimer", "split-literal", "clock64-ptx", "x86-rdtsc", "raw-bytes", "syscall",
        "clock64"])
def test_cuda_timer_in_inline_assembly_is_flagged(tmp_path: Path, body: str, word: str) -> None:
    """CUDA may use inline assembly (PTX), but not to read a clock: asm strings are read on
    the raw text (adjacent literals joined, as the compiler joins them)."""
    path = tmp_path / "kernel.cu"
    path.write_text(_cuda_kernel(body))
    findings = check_source(path, "cuda", "silu_mul")
    assert any(word in f for f in findings), findings


def test_cuda_stringized_assembly_is_flagged(tmp_path: Path) -> None:
    body = '    long long t; asm volatile(S(mov.u64 %0, %globaltimer;) : "=l"(t));'
    path = tmp_path / "kernel.cu"
    path.write_text(_cuda_kernel(body, "#define S(x) #x"))
    findings = check_source(path, "cuda", "silu_mul")
    assert any("stringizes" in f for f in findings), findings
    assert any("globaltimer" in f for f in findings), findings


def test_cuda_ptx_without_timers_passes(tmp_path: Path) -> None:
    body = ('    unsigned s = 0; const float *p = out;\n'
            '    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" :: "r"(s), "l"(p));')
    path = tmp_path / "kernel.cu"
    path.write_text(_cuda_kernel(body))
    assert check_source(path, "cuda", "silu_mul") == []


def test_clean_avx2_kernel_with_immintrin_passes(tmp_path: Path) -> None:
    body = """    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    for (; i < n; i++) out[i] = a[i] * b[i];"""
    assert _check(tmp_path, _c_kernel(body, "#include <immintrin.h>"), "c") == []


# -- Python (triton) ---------------------------------------------------------------------------

CLEAN_TRITON = '''
import triton
import triton.language as tl


@triton.jit
def _kernel(out_ptr, a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, a / (1.0 + tl.exp(-a)) * b, mask=mask)


def launch(out, a, b):
    n = a.numel()
    _kernel[(triton.cdiv(n, 1024),)](out, a, b, n, BLOCK=1024)
'''


def test_clean_triton_kernel_passes(tmp_path: Path) -> None:
    assert _check(tmp_path, CLEAN_TRITON, "triton") == []


@pytest.mark.parametrize(("launcher", "word"), [
    ("import os\n\ndef launch(out, a, b):\n    os.getpid()\n", "imports os"),
    ("import subprocess\n\ndef launch(out, a, b):\n    subprocess.run(['true'])\n",
     "imports subprocess"),
    ("def launch(out, a, b):\n    open('/tmp/x', 'w')\n", "uses open()"),
    ("import torch\n\ndef launch(out, x):\n    out.copy_(torch.softmax(x, -1))\n",
     "torch.softmax"),
    ("def launch(out, a, b):\n    out[:] = a @ b\n", "@ operator"),
    ("def launch(out, a, b):\n    __import__('time')\n", "uses __import__()"),
    ("import math\n\ndef launch(out, a, b):\n    setattr(math, 'pi', 3)\n", "uses setattr()"),
])
def test_python_cheats_are_flagged(tmp_path: Path, launcher: str, word: str) -> None:
    findings = _check(tmp_path, launcher, "triton")
    assert any(word in f for f in findings), findings


@pytest.mark.parametrize("launcher", [
    "import torch\n\ndef launch(out, x):\n    getattr(torch, 'soft' + 'max')(x, -1)\n",
    "def launch(out, x):\n    __builtins__['op' + 'en']('/tmp/x', 'w')\n",
], ids=["getattr", "__builtins__"])
def test_python_dynamic_lookups_are_flagged(tmp_path: Path, launcher: str) -> None:
    assert _check(tmp_path, launcher, "triton") != []


# Each bypass of a checker that read names instead of meanings: the finding names what the
# alias really reaches.
@pytest.mark.parametrize(("launcher", "word"), [
    ("import torch as tl\n\ndef launch(out, a, b):\n"
     "    tl.sys.modules['strata.kernels.checks'].compare = None\n", "torch.sys"),
    ("import torch as tl\n\ndef launch(out, a, b):\n"
     "    out.copy_(tl.nn.functional.silu(a) * b)\n", "torch.nn.functional.silu"),
    ("import torch as T\n\ndef launch(out, a, b):\n    T.sys.modules\n", "torch.sys"),
    ("from torch import sys\n\ndef launch(out, a, b):\n    sys.modules\n",
     "imports torch.sys"),
    ("from torch import softmax\n\ndef launch(out, x):\n    out.copy_(softmax(x, -1))\n",
     "torch.softmax"),
    ("from torch.nn import functional as F\n\ndef launch(out, a, b):\n    F.silu(a)\n",
     "torch.nn.functional.silu"),
    ("import torch\n\nx = torch\n\ndef launch(out, a, b):\n    x.sys.modules\n",
     "torch.sys"),
    ("import triton.language as tl\n\nx = tl\ny = x\n\ndef launch(out, a, b):\n"
     "    y.sys.modules\n", "triton.language.sys"),
    ("import torch as libdevice\n\ndef launch(out, a, b):\n    libdevice.exp(a)\n",
     "torch.exp"),
    ("import triton\n\ndef launch(out, a, b):\n    triton.runtime.cache.os.getpid()\n",
     "triton.runtime.cache.os"),
    ("import triton\n\ndef launch(out, a, b):\n    triton._C\n", "triton._C"),
    ("import typing\n\ndef launch(out, a, b):\n    typing.get_type_hints(launch)\n",
     "typing.get_type_hints"),
    ("import math\n\ndef launch(out, a, b):\n    math.isclose = None\n",
     "assigns math.isclose"),
    ("from builtins import open as o\n\ndef launch(out, a, b):\n    o('/tmp/x')\n",
     "builtins.open"),
    ("import torch\n\nclass Hide:\n    t = torch\n", "reaches torch"),
], ids=["import-as-tl", "import-as-tl-silu", "import-as-T", "from-torch-import-sys",
        "from-torch-import-op", "from-torch-nn-import-as-F", "assigned-alias",
        "alias-of-alias", "import-as-libdevice", "module-inside-triton", "private",
        "string-eval", "rebinds-module", "from-builtins", "class-attribute"])
def test_python_aliases_are_resolved(tmp_path: Path, launcher: str, word: str) -> None:
    findings = _check(tmp_path, launcher, "triton")
    assert any(word in f for f in findings), findings
    assert all(f.startswith("line ") and " — " in f and "\n" not in f for f in findings)


@pytest.mark.parametrize(("launcher", "word"), [
    ("import triton.language as tl\n\ndef peek(m):\n    return m.sys\n\n"
     "def launch(out, a, b):\n    peek(tl)\n", "module triton.language as a value"),
    ("import math\n\nMODULES = [math]\n", "module math as a value"),
    ("import triton\n\ndef get():\n    return triton\n", "module triton as a value"),
    ("import triton.language as tl\n\ndef launch(out, a, b):\n    print((m := tl))\n",
     "module triton.language as a value"),
    ("from triton import language\n\ndef launch(out, a, b, m=language):\n    pass\n",
     "module triton.language as a value"),
], ids=["argument", "container", "returned", "walrus", "default"])
def test_python_module_used_as_a_value_is_flagged(tmp_path: Path, launcher: str,
                                                  word: str) -> None:
    findings = _check(tmp_path, launcher, "triton")
    assert any(word in f for f in findings), findings


@pytest.mark.parametrize(("launcher", "word"), [
    ("def nojit(f):\n    return f\n\n@nojit\ndef launch(out, a, b):\n"
     "    out.copy_(a.softmax(-1))\n", ".softmax()"),
    ("def my_jit(f):\n    return f\n\n@my_jit\ndef launch(out, a, b):\n"
     "    out[:] = a @ b\n", "@ operator"),
    ("def launch(out, a, b):\n    g = (i for i in ())\n    g.gi_frame.f_back\n", "gi_frame"),
    ("def launch(out, a, b):\n    scope = {}\n    scope['__builtins__']\n", "__builtins__"),
    ("def launch(out, a, b):\n    out.apply_(lambda v: v)\n", ".apply_()"),
    ("from torch import *\n", "imports * from torch"),
    ("from . import helper\n", "relative import"),
    ("import triton.language as tl\n\ndef launch(out, tl, b):\n    out[:] = tl.softmax(-1)\n",
     ".softmax()"),
], ids=["fake-jit-method", "fake-jit-matmul", "frame", "dunder-string", "callback",
        "star-import", "relative-import", "parameter-named-like-an-alias"])
def test_python_other_bypasses_are_flagged(tmp_path: Path, launcher: str, word: str) -> None:
    findings = _check(tmp_path, launcher, "triton")
    assert any(word in f for f in findings), findings


def test_python_resolution_keeps_honest_spellings(tmp_path: Path) -> None:
    """Triton through any alias, torch dtypes through any alias, local variables that share
    a module's name, scratch from a given tensor."""
    launcher = '''
from torch import float32
from triton import jit, cdiv
import triton.language as language
import torch as th


@jit
def _kernel(out_ptr, a_ptr, n, BLOCK: language.constexpr):
    offs = language.program_id(0) * BLOCK + language.arange(0, BLOCK)
    x = language.load(a_ptr + offs, mask=offs < n).to(language.float32)
    language.store(out_ptr + offs, language.sum(x, axis=0) * x, mask=offs < n)


def launch(out, a, b):
    np = cdiv(a.numel(), 1024)
    time = a.new_empty((np,), dtype=float32)
    t2 = a.new_empty((np,), dtype=th.bfloat16)
    _kernel[(np,)](out, a, a.numel(), BLOCK=1024)
    return time, t2
'''
    assert _check(tmp_path, launcher, "triton") == []


@pytest.mark.parametrize("name", ["alias_launcher.py", "production_action.py"])
def test_alias_fixtures_are_refused_naming_torch_sys(name: str) -> None:
    path = ADVERSARIAL / name
    findings = check_source(path, "triton", "silu_mul")
    assert any("torch.sys" in f for f in findings), findings


@pytest.mark.parametrize("name", ["reads_output.py", "writes_file.py", "writes_at_load.py",
                                  "honest_rmsnorm.c"])
def test_fixtures_meant_for_the_runtime_pass_the_static_check(name: str) -> None:
    """Honest kernels, and cheats only the runtime can catch (tests/test_gen_judge.py expects
    them to get that far), are not refused here."""
    dialect = "c" if name.endswith(".c") else "triton"
    assert check_source(ADVERSARIAL / name, dialect, "silu_mul") == []


# -- built-in sources --------------------------------------------------------------------------

def test_every_builtin_source_passes_the_static_check() -> None:
    from strata.kernels.impl import builtin_implementations

    impls = builtin_implementations()
    assert {i.dialect for i in impls} >= {"c", "triton", "cuda"}
    flagged = {i.key: check_source(i.source, i.dialect, i.op) for i in impls}
    assert {k: v for k, v in flagged.items() if v} == {}
