"""`strata.kernels.get(op)(out, *inputs)` checks the op's contract before raw pointers are
used: wrong dtype, device, layout, shapes or parameters raise a clear InputError."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.errors import InputError

torch = pytest.importorskip("torch")


def _rmsnorm(rows: int = 4, cols: int = 64, dtype: object = None) -> tuple:
    dtype = dtype or torch.float32
    x = torch.randn(rows, cols, dtype=dtype)
    return torch.empty(rows, cols, dtype=dtype), x, torch.randn(cols, dtype=dtype)


@pytest.fixture
def verified_rmsnorm(strata_home: Path):  # -> strata.kernels.Choice
    """rmsnorm dispatched to a verified C kernel (verified, not benchmarked)."""
    from strata import kernels
    from strata.kernels.service import run_verify, select, session
    from strata.store import open_db

    strata_home.mkdir(parents=True, exist_ok=True)
    s = session(conn=open_db(strata_home / "strata.db"))
    verdicts = run_verify(s, select("rmsnorm", "c.naive", s.conn), force=False,
                          timeout_s=300, progress=lambda _m: None)
    assert verdicts[0].status == "pass", (verdicts[0].reason, verdicts[0].message)
    choice = kernels.get("rmsnorm", db=strata_home / "strata.db")
    assert choice.decision.impl is not None and choice.decision.impl.dialect == "c"
    return choice


@pytest.mark.slow
def test_a_correct_call_matches_the_reference(verified_rmsnorm) -> None:
    out, x, w = _rmsnorm()
    verified_rmsnorm(out, x, w)
    ref = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(out, ref, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("wrong, words", [
    (lambda: _rmsnorm(dtype=torch.float64), "float64"),
    (lambda: (lambda o, x, w: (o, x.t().contiguous().t(), w))(*_rmsnorm(8, 8)),
     "not contiguous"),
    (lambda: (lambda o, x, w: (o[:, ::2], x[:, ::2], w[::2]))(*_rmsnorm()), "not contiguous"),
    (lambda: (lambda o, x, w: (o, x, w[:10]))(*_rmsnorm()), "do not fit together"),
    (lambda: (lambda o, x, w: (o[:2], x, w))(*_rmsnorm()), "out has shape"),
    (lambda: (lambda o, x, w: (o, x.to(torch.int64), w))(*_rmsnorm()), "floating point"),
    (lambda: (lambda o, x, w: (o, x.reshape(-1), w))(*_rmsnorm()), "dimension"),
])
def test_each_wrong_form_raises_naming_the_problem(verified_rmsnorm, wrong, words) -> None:
    out, x, w = wrong()
    before = out.clone()
    with pytest.raises(InputError, match=words):
        verified_rmsnorm(out, x, w)
    assert torch.equal(out.nan_to_num(0.5), before.nan_to_num(0.5))  # nothing written


@pytest.mark.slow
def test_an_unknown_parameter_is_refused(verified_rmsnorm) -> None:
    out, x, w = _rmsnorm()
    with pytest.raises(InputError, match=r"epsilon.*eps="):
        verified_rmsnorm(out, x, w, epsilon=1e-5)


def test_the_fallback_path_checks_the_contract_too(strata_home: Path) -> None:
    from strata import kernels

    choice = kernels.get("rmsnorm", db=strata_home / "strata.db")  # nothing verified here
    assert choice.is_fallback
    out, x, w = _rmsnorm()
    with pytest.raises(InputError, match="expected 2 input"):
        choice(out, x)
    with pytest.raises(InputError, match="mixed float dtypes"):
        choice(out, x, w.double())
    choice(out, x, w)  # and a correct call works
    assert torch.isfinite(out).all()
