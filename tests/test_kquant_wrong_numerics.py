"""The K-quant linear specs tell ggml's numerics from the plausible wrong ones (issue "Real
files"): on every verification shape, an output computed with float32 activations, with
q8_0 activations (32-value blocks, fp16 d) instead of q8_K, or — for the x8 ops — with the
packed bytes read as if they were the file's layout, is outside the spec's tolerance of the
float64 oracle. The clauses (tests/test_kernels_clauses.py) cover the finer rules (ties,
scale bits, special d); these are the whole-model mistakes a kernel writer makes first.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from strata.kernels import checks
from strata.kernels.ops import _kquant, _kquant_x8
from strata.kernels.spec import get_spec

KINDS = ("q4_K", "q5_K", "q6_K")


def _q8_0(x: Any) -> Any:
    """x rounded through q8_0 as ggml's quantize_row_q8_0 does (32-blocks, fp16 d)."""
    blocks = x.double().reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    d = (amax / 127).float().half().double()
    inv = torch.where(amax > 0, 127 / amax.clamp_min(1e-30), torch.zeros_like(amax))
    return (torch.round(blocks * inv) * d).reshape(x.shape)


def _fp32_x(kind: str, x: Any, w: Any) -> Any:
    return x.double() @ _kquant.dequantize(kind, w, x.shape[1]).T


def _q8_0_x(kind: str, x: Any, w: Any) -> Any:
    return _q8_0(x) @ _kquant.dequantize(kind, w, x.shape[1]).T


def _cases(op: str) -> list[tuple[dict[str, int], list[Any]]]:
    spec = get_spec(op)
    return [(s, spec.make_inputs(dict(s), "float32", seed, "cpu"))
            for s in spec.shapes["verify"] for seed in (0, 1)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("wrong", [_fp32_x, _q8_0_x], ids=["fp32-activations", "q8_0-activations"])
def test_wrong_activation_numerics_fail_every_verify_shape(kind: str, wrong: Any) -> None:
    spec = get_spec(f"linear_{kind}")
    tol = spec.tolerance("float32")
    for shape, (x, w) in _cases(spec.name):
        ref = spec.reference(x, w)
        assert checks.compare(spec.eager(x, w), ref, tol) is None, shape  # the oracle's twin
        assert checks.compare(wrong(kind, x, w).float(), ref, tol) is not None, (kind, shape)


@pytest.mark.parametrize("kind", _kquant_x8.KINDS)
def test_x8_bytes_read_in_the_file_layout_fail(kind: str) -> None:
    """A file-layout kernel handed the x8 bytes (the layout mixed up at dispatch) is wrong at
    every shape with a whole group of 8 rows."""
    spec = get_spec(f"linear_{kind}x8")
    tol = spec.tolerance("float32")
    grouped = [(s, i) for s, i in _cases(spec.name) if s["N"] >= _kquant_x8.ROWS]
    assert grouped
    for shape, (x, w8) in grouped:
        ref = spec.reference(x, w8)
        assert checks.compare(_kquant.linear(kind, x, w8), ref, tol) is not None, shape
        # and the file's own bytes, through the file-layout arithmetic, are the same op
        file_rows = _kquant_x8.unpack(kind, w8, shape["K"])
        assert checks.compare(_kquant.linear(kind, x, file_rows), ref, tol) is None, shape
