"""Extraction of the kernel from a model's reply: the fenced block that defines the entry,
the declaration checked or added, and every way a reply can fail to hold a kernel."""

from __future__ import annotations

import time

from strata.kernels.gen.extract import MAX_CODE_CHARS, default_entry, extract_code

BODY = """\
#include <math.h>
#include <stdint.h>

void strata_rmsnorm(float *out, const float *x, const float *w, int64_t rows, int64_t cols,
                    float eps) {
    for (int64_t i = 0; i < rows * cols; i++) out[i] = x[i] * w[i % cols];
}
"""
DECL = "// strata-kernel: op=rmsnorm dialect=c entry=strata_rmsnorm"


def block(code: str, lang: str = "c", fence: str = "```") -> str:
    return f"{fence}{lang}\n{code}{fence}\n"


def test_prose_around_one_block_with_its_declaration() -> None:
    reply = f"Here you go:\n\n{block(DECL + chr(10) + BODY)}\nThis is fast because..."
    got = extract_code(reply, "rmsnorm", "c", "strata_rmsnorm")
    assert got.problem == "" and got.ok
    assert got.code == DECL + "\n" + BODY
    assert (got.blocks, got.defining, got.declaration_added) == (1, 1, False)


def test_a_missing_declaration_is_added() -> None:
    got = extract_code(block(BODY), "rmsnorm", "c", "strata_rmsnorm")
    assert got.code == DECL + "\n" + BODY and got.declaration_added
    py = "import triton\n\ndef launch(out, a, b):\n    pass\n"
    got = extract_code(block(py, "python"), "silu_mul", "triton", "launch")
    assert got.code is not None
    assert got.code.splitlines()[0] == "# strata-kernel: op=silu_mul dialect=triton entry=launch"


def test_a_declaration_for_another_op_or_entry_is_refused_not_corrected() -> None:
    other = DECL.replace("op=rmsnorm", "op=softmax")
    got = extract_code(block(other + "\n" + BODY), "rmsnorm", "c", "strata_rmsnorm")
    assert got.code is None
    assert "op=softmax (asked for op=rmsnorm)" in got.problem
    no_entry = "// strata-kernel: op=rmsnorm dialect=c entry=my_norm\n" + BODY
    got = extract_code(block(no_entry), "rmsnorm", "c", "strata_rmsnorm")
    assert got.code is None and "entry=my_norm" in got.problem


def test_the_block_that_defines_the_entry_wins_over_helpers_and_calls() -> None:
    helper = "static inline float sq(float v) { return v * v; }\n"
    call = "int main(void) { strata_rmsnorm(0, 0, 0, 1, 1, 1e-6f); }\n"
    proto = "void strata_rmsnorm(float *out, const float *x, const float *w, int64_t rows,\n" \
        "                    int64_t cols, float eps);\n"
    reply = "\n".join([block(helper), block(call), block(proto, "h"), block(BODY, "cpp")])
    got = extract_code(reply, "rmsnorm", "c", "strata_rmsnorm")
    assert (got.blocks, got.defining) == (4, 1)
    assert got.code is not None and got.code.endswith(BODY)


def test_two_blocks_defining_the_entry_take_the_first() -> None:
    second = BODY.replace("x[i] * w", "2 * x[i] * w")
    got = extract_code(block(BODY) + "Or, faster:\n" + block(second, "", "~~~"), "rmsnorm",
                       "c", "strata_rmsnorm")
    assert got.defining == 2 and got.code is not None
    assert "2 * x[i]" not in got.code


def test_the_wrong_entry_name_says_which_one_was_asked_for() -> None:
    got = extract_code(block(BODY.replace("strata_rmsnorm", "rmsnorm_fast")), "rmsnorm", "c",
                       "strata_rmsnorm")
    assert got.code is None
    assert got.problem == "no code block defines strata_rmsnorm (1 block(s) in the reply)"


def test_no_block_empty_reply_and_html_page() -> None:
    assert extract_code(BODY, "rmsnorm", "c").problem == \
        "no fenced code block (```) in the reply"  # raw code without a fence: refused
    assert extract_code("  \n", "rmsnorm", "c").problem == "the reply is empty"
    html = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head></html>"
    assert "HTML page" in extract_code(html, "rmsnorm", "c").problem


def test_a_reply_cut_off_inside_its_block() -> None:
    cut = "```c\n" + BODY[:120]  # the token limit hit before the body
    got = extract_code(cut, "rmsnorm", "c", "strata_rmsnorm")
    assert got.code is None and "not closed" in got.problem
    whole = "```c\n" + BODY  # cut after the body, before the closing fence: usable
    assert extract_code(whole, "rmsnorm", "c", "strata_rmsnorm").code is not None


def test_a_megabyte_of_junk_is_refused_quickly() -> None:
    junk = ("strata_rmsnorm(" + "lorem ipsum " * 90_000)[:1 << 20]
    started = time.perf_counter()
    assert extract_code(junk, "rmsnorm", "c").problem.startswith("no fenced code block")
    fenced = "```c\n" + junk + "\n```\n"
    got = extract_code(fenced, "rmsnorm", "c")
    assert time.perf_counter() - started < 1.0
    assert got.code is None and f"at most {MAX_CODE_CHARS:,}" in got.problem


def test_an_ifunc_or_alias_counts_as_defining_the_entry() -> None:
    """The link check must get to refuse it (forbidden_link), not extraction (format)."""
    ifunc = "void strata_silu_mul(float *o, const float *a, const float *b, int64_t n)\n" \
        '    __attribute__((ifunc("resolve")));\n'
    assert extract_code(block(ifunc), "silu_mul", "c", "strata_silu_mul").code is not None


def test_default_entry_comes_from_the_dialect() -> None:
    assert default_entry("rmsnorm", "c") == "strata_rmsnorm"
    assert extract_code(block(BODY), "rmsnorm", "c").code is not None
