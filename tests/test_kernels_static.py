"""Static checks on external kernel sources (strata.kernels.static_check): what a kernel has
no business doing is flagged before anything runs; ordinary kernel code is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.kernels.static_check import check_source

C_HEAD = "#include <stdint.h>\n#include <stdlib.h>\n"


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


# -- built-in sources --------------------------------------------------------------------------

def test_every_builtin_source_passes_the_static_check() -> None:
    from strata.kernels.impl import builtin_implementations

    impls = builtin_implementations()
    assert {i.dialect for i in impls} >= {"c", "triton", "cuda"}
    flagged = {i.key: check_source(i.source, i.dialect, i.op) for i in impls}
    assert {k: v for k, v in flagged.items() if v} == {}
