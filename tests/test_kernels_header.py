"""Shared C headers (kernels/sources/c/strata_*.h): the built-in C kernels include their
SIMD helpers instead of copying them, a header's bytes are part of each user's content hash
(so editing it re-verifies them), and an external kernel may include them by name but
nothing else by "..." (kernels/static_check.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from strata.kernels import impl as impl_mod
from strata.kernels.dialects.c import header_flags
from strata.kernels.impl import C_HEADERS, builtin_implementations, from_source, shared_header_names
from strata.kernels.static_check import check_source
from strata.kernels.verify import VerifyContext, verify

C_SOURCES = sorted(p for p in C_HEADERS.glob("*.c"))
HEADERS = sorted(C_HEADERS.glob("strata_*.h"))
# Copies kept on purpose: tests/test_kernels_linear_q.py plants wrong roundings (round half
# away) by editing each linear_q*.naive.c's own q8_0 quantisation of x.
KEPT_COPIES = {"quantize_block": {"linear_q4_0.naive.c", "linear_q5_0.naive.c",
                                    "linear_q8_0.naive.c"}}
_FUNCTION = re.compile(r"^static\b[^;{}()]*?\b(\w+)\s*\([^;{}]*\)\s*\{", re.M)
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def _functions(path: Path) -> dict[str, str]:
    """name -> body (comments dropped, whitespace collapsed) of each static function."""
    text = _COMMENT.sub(" ", path.read_text())
    found = {}
    for m in _FUNCTION.finditer(text):
        depth, j = 0, m.end() - 1
        while True:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        found[m.group(1)] = " ".join(text[m.start():j + 1].split())
    return found


def _c_builtin(key: str):
    return next(i for i in builtin_implementations() if i.key == key)


# -- (a) one copy of each helper ---------------------------------------------------------------

def test_the_shared_headers_exist_and_are_used() -> None:
    assert {h.name for h in HEADERS} == set(shared_header_names()) >= {
        "strata_simd.h", "strata_attention.h", "strata_half.h"}
    users = {h.name: [i.key for i in builtin_implementations() if h in i.headers()]
             for h in HEADERS}
    assert all(users.values()), users
    # the attention header includes the SIMD one: its users hash both
    assert {h.name for h in _c_builtin("decode_attention/c.avx2").headers()} == {
        "strata_attention.h", "strata_simd.h"}
    assert _c_builtin("matmul/c.naive").headers() == ()


def test_no_two_c_sources_define_the_same_helper() -> None:
    """A static function defined identically in two built-in C files (or again next to a
    shared header that defines it) is a copy: it belongs in a shared header."""
    where: dict[str, list[str]] = {}
    shared: dict[str, str] = {}
    for header in HEADERS:
        for name, body in _functions(header).items():
            assert name not in shared, f"{name} is defined in {shared[name]} and {header.name}"
            shared[name] = header.name
            where.setdefault(body, []).append(header.name)
    for source in C_SOURCES:
        for name, body in _functions(source).items():
            assert name not in shared, \
                f"{source.name} defines {name}, which {shared[name]} already defines"
            where.setdefault(body, []).append(source.name)
    copies = {body.split("(")[0]: files for body, files in where.items() if len(files) > 1
              and not any(set(files) == kept and f" {name}(" in body.split("{")[0]
                          for name, kept in KEPT_COPIES.items())}
    assert not copies, copies
    # the flash-decoding kernels share their common part (they once repeated 152 lines):
    # decode_attention calls the quad itself, the cached and windowed kernels the driver
    # around it (strata_attention.h: cached_attention, cached_item, decode_quad)
    for name, call in (("decode_attention.avx2.c", "decode_quad("),
                       ("attention_cached.avx2.c", "cached_attention("),
                       ("attention_window.avx2.c", "cached_attention(")):
        text = (C_HEADERS / name).read_text()
        assert '#include "strata_attention.h"' in text and call in text
        assert not {"decode_quad", "cached_item", "cached_attention"} & \
            set(_functions(C_HEADERS / name))


# -- (b) a header's bytes are part of each user's hash -----------------------------------------

def test_editing_a_header_changes_the_hash_of_its_users_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    users = [_c_builtin("softmax/c.avx2"), _c_builtin("decode_attention/c.avx2")]
    others = [_c_builtin("matmul/c.naive"), _c_builtin("linear_q8_0/c.naive")]
    copy = tmp_path / "c"
    copy.mkdir()
    for header in HEADERS:
        shutil.copy(header, copy / header.name)
    monkeypatch.setattr(impl_mod, "C_HEADERS", copy)
    before = {i.key: (i.content_hash(), header_flags(i)) for i in users + others}
    assert all(str(copy) in flags for _, flags in before.values())

    (copy / "strata_simd.h").write_text((copy / "strata_simd.h").read_text() + "\n/* x */\n")
    after = {i.key: (i.content_hash(), header_flags(i)) for i in users + others}
    for i in users:  # decode_attention through strata_attention.h -> strata_simd.h
        assert after[i.key][0] != before[i.key][0], i.key
        assert after[i.key][1] != before[i.key][1], i.key  # the build cache rebuilds it
    for i in others:
        assert after[i.key] == before[i.key], i.key

    # the real headers hash as the copies did before the edit
    monkeypatch.setattr(impl_mod, "C_HEADERS", C_HEADERS)
    assert {i.key: i.content_hash() for i in users + others} == \
        {k: h for k, (h, _) in before.items()}


# -- external kernels: the shared headers by name, nothing else --------------------------------

EXTERNAL = """// strata-kernel: op=softmax dialect=c entry=strata_softmax requires=avx2,fma
#include <math.h>
#include <stdint.h>
%s

void strata_softmax(float *out, const float *x, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *o = out + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            __m256 e = exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + c), _mm256_set1_ps(m)));
            _mm256_storeu_ps(o + c, e);
            s += hsum256_ps(e);
        }
        for (; c < cols; c++) { o[c] = expf(xr[c] - m); s += o[c]; }
        for (c = 0; c < cols; c++) o[c] /= s;
    }
}
"""


@pytest.mark.parametrize("include", [
    '#include "/etc/passwd"', "#include </etc/passwd>", "#include <../../../etc/passwd>",
    '#include "softmax.avx2.c"', '#define F "/etc/hostname"\n#include F',
    '%:include "strata_simd.h/../softmax.avx2.c"', '#inc\\\nlude "x.h"',
    '#include_next <stdio.h>', '#embed "/etc/passwd"', '#pragma GCC dependency "/etc/passwd"',
])
def test_external_kernels_include_no_other_file(tmp_path: Path, include: str) -> None:
    path = tmp_path / "softmax.ext.c"
    path.write_text(EXTERNAL % f'#include "strata_simd.h"\n{include}')
    findings = check_source(path, "c", "softmax")
    assert findings and all("line" in f for f in findings), findings


def test_an_external_kernel_may_include_the_shared_header(kernel_session,
                                                          tmp_path: Path) -> None:
    s = kernel_session
    path = tmp_path / "softmax.ext.c"
    path.write_text(EXTERNAL % '#include "strata_simd.h"')
    assert check_source(path, "c", "softmax") == []
    impl = from_source(path, origin="external", name="c.ext.softmax")
    assert [h.name for h in impl.headers()] == ["strata_simd.h"]
    if impl.requires.check(s.caps):
        pytest.skip(f"this host lacks {impl.requires.describe()}")
    verdict = verify(impl, VerifyContext(s.conn, s.fingerprint, s.caps))
    assert verdict.passed, (verdict.reason, verdict.message, verdict.details)


# -- (c) the built-in users still verify -------------------------------------------------------

HEADER_USERS = ["softmax/c.avx2", "silu_mul/c.avx2", "decode_attention/c.avx2",
                "attention_cached/c.avx2", "attention_lse/c.avx2", "matvec_q4_0/c.avx2",
                "linear_q8_0/c.avx2", "linear_q8_0/c.naive", "linear_f16/c.naive"]


def test_builtin_header_users_verify(kernel_session) -> None:
    """A kernel of each header (and each user of strata_attention.h's three parts) through
    the real verification path; tests/test_kernels_lab.py verifies every built-in."""
    from strata.commands.kernels import run_verify

    s = kernel_session
    impls = [_c_builtin(k) for k in HEADER_USERS]
    assert all(i.headers() for i in impls)
    verdicts = run_verify(s, impls, force=True, timeout_s=300, progress=lambda _m: None)
    for v in verdicts:
        missing = v.impl.requires.check(s.caps)
        if missing:
            assert v.status == "unavailable", (v.impl.key, v.status)
        else:
            assert v.status == "pass", (v.impl.key, v.reason, v.message, v.details)
