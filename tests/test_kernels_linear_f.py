"""The float-weight linears (linear_f32, linear_f16) and KV-cache attention
(attention_cached): the contract's fixed dtypes, the built-ins through the real sandbox,
deliberately wrong variants, and a hand check of attention_cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.errors import InputError

torch = pytest.importorskip("torch")


# -- the contract: a fixed dtype next to the call's float dtype --------------------------------

def test_linear_f16_takes_float32_x_with_a_float16_weight(strata_home: Path) -> None:
    from strata import kernels

    choice = kernels.get("linear_f16", db=strata_home / "strata.db")
    x, w = torch.randn(3, 40), torch.randn(5, 40).half()
    out = torch.empty(3, 5)
    choice(out, x, w)
    ref = x.half().double() @ w.double().T
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(InputError, match=r"w must be float16, not torch\.float32"):
        choice(out, x, w.float())
    with pytest.raises(InputError, match="mixed float dtypes"):
        choice(out, x.double(), w)


def test_linear_f32_keeps_the_one_float_dtype_rule(strata_home: Path) -> None:
    from strata import kernels

    choice = kernels.get("linear_f32", db=strata_home / "strata.db")
    x, w = torch.randn(2, 9), torch.randn(4, 9)
    with pytest.raises(InputError, match="mixed float dtypes"):
        choice(torch.empty(2, 4), x, w.half())
    with pytest.raises(InputError, match="do not fit together"):
        choice(torch.empty(2, 4), x, torch.randn(4, 8))
