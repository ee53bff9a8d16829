"""The model's projections (x·Wᵀ) under `--kernels lab`: dispatch decides whether the lab's
matmul serves them, from what the host already verified and benchmarked (LabOps never
verifies matmul itself).

Homes are seeded with stored verdicts rather than verified in the sandbox (tens of seconds
per op here): a pass for each hot op's preferred built-in, so LabOps has nothing to verify,
and for matmul either nothing, a benchmark that loses to torch (this CPU's measured case), or
one that wins (a host where the lab's matmul is faster). The seeded figures only steer
dispatch; every kernel that runs is the real built-in, compared against the torch twin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from strata.train import ops_lab  # noqa: E402
from strata.train.model import Llama  # noqa: E402
from strata.train.ops_torch import TorchOps  # noqa: E402
from strata.train.presets import PRESETS  # noqa: E402
from tests.seed_host import seeded_home  # noqa: E402


def _seed(home: Path, matmul_speedup: float | None) -> None:
    """Stored verdicts in `home`: each hot op's preferred runnable built-in passed; matmul's
    (when `matmul_speedup` is given) passed and benchmarked at that speed over torch."""
    from strata.kernels.ensure import candidates
    from strata.kernels.service import session
    from strata.store import open_db
    from strata.store.kernels import KernelResult, save_kernel_results

    s = session(conn=open_db(home / "strata.db"))
    rows = []
    ops = ops_lab.needed_ops() + ([ops_lab.MATMUL] if matmul_speedup else [])
    for op in ops:
        impl = candidates(s.conn, s.caps, op, "cpu")[0]  # what ensure_verified tries first
        rows.append(KernelResult(op, impl.name, impl.content_hash(), "verify", "pass", "cpu",
                                 "float32", {"ok": True, "cases": 5}))
        if op == ops_lab.MATMUL:
            rows.append(KernelResult(op, impl.name, impl.content_hash(), "bench", "ok", "cpu",
                                     "float32", {"speedup_eager": matmul_speedup},
                                     shape={"M": 128, "N": 64, "K": 64}))
    save_kernel_results(s.conn, s.fingerprint, rows)
    s.conn.close()


def _lab(factory: pytest.TempPathFactory, name: str, matmul_speedup: float | None) -> Any:
    from strata.store import open_db

    # one LabOps per test: LAB's choices are module-global, the last LabOps' ones
    torch.set_num_threads(1)
    home = seeded_home(factory, name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        _seed(home, matmul_speedup)
        return ops_lab.LabOps("cpu", open_db(home / "strata.db"))


class _Counting:
    """LAB's matmul choice, counting the calls that reach it."""

    def __init__(self, choice: Any) -> None:
        self.choice, self.calls = choice, 0

    def run_packed(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.choice.run_packed(*args, **kwargs)


def _count_matmul(monkeypatch: pytest.MonkeyPatch) -> _Counting:
    counter = _Counting(ops_lab.LAB.choices[ops_lab.MATMUL])
    monkeypatch.setitem(ops_lab.LAB.choices, ops_lab.MATMUL, counter)
    return counter


def _step0(lab: Any) -> tuple[tuple[Any, Any, Any], tuple[Any, Any, Any], Any]:
    """(twin, logits, loss) and (ours, logits, loss) after one forward/backward on the same
    weights and batch, and the model config."""
    cfg = PRESETS["test"].model
    twin, ours = Llama(cfg, TorchOps()), Llama(cfg, lab)
    ours.load_state_dict(twin.state_dict())
    ids = torch.randint(0, cfg.vocab, (2, cfg.ctx + 1), generator=torch.Generator()
                        .manual_seed(0))
    x, y = ids[:, :-1], ids[:, 1:]
    (lt, loss_t), (lo, loss_o) = twin(x, y), ours(x, y)
    loss_t.backward()
    loss_o.backward()
    return (twin, lt, loss_t), (ours, lo, loss_o), cfg


def test_a_winning_lab_matmul_serves_every_projection_forward_and_backward(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = _lab(tmp_path_factory, "matmul-wins", 2.0)
    decision = lab.decisions[ops_lab.MATMUL]
    assert decision.outcome == "kernel" and decision.impl is not None
    assert lab.served()[ops_lab.MATMUL] == {"impl": decision.chosen, "outcome": "kernel",
                                            "why": "verified, fastest: 2.00x torch eager"}
    counter = _count_matmul(monkeypatch)
    (twin, lt, loss_t), (ours, lo, loss_o), cfg = _step0(lab)
    # every projection and the tied head: one matmul forward, two backward (dx and dW)
    assert counter.calls == 3 * (7 * cfg.n_layers + 1)
    assert counter.choice._kernel is not None  # the C kernel ran, not the vendor path
    # the twin test's rules (tests/test_train_lab_ops.py): float32 sums in another order
    assert (lt - lo).abs().max() < 1e-4
    assert abs(loss_t.item() - loss_o.item()) < 1e-5
    for (name, p), q in zip(twin.named_parameters(), ours.parameters(), strict=True):
        scale = p.grad.abs().max().clamp_min(1e-6)
        assert ((p.grad - q.grad).abs().max() / scale) < 1e-3, name


@pytest.mark.parametrize(("speedup", "outcome", "why"), [
    (None, "fallback", "fallback to the torch reference: no verified implementation runs here"),
    (0.5, "vendor", "torch eager is faster than every verified implementation here")])
def test_without_a_winning_lab_matmul_torch_serves_the_projections(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        speedup: float | None, outcome: str, why: str) -> None:
    """A fresh home (nothing verified for matmul) and this CPU's measured case (the lab's
    matmul slower than torch): dispatch keeps torch, and says why."""
    lab = _lab(tmp_path_factory, f"matmul-{outcome}", speedup)
    assert not lab.lab_matmul
    from strata.kernels.registry import EAGER

    assert lab.served()[ops_lab.MATMUL] == {"impl": EAGER, "outcome": outcome, "why": why}
    # the run record: the hot ops' decisions and matmul's (tests/test_train_cli.py's set)
    assert set(lab.served()) == {*ops_lab.needed_ops(), ops_lab.MATMUL}
    counter = _count_matmul(monkeypatch)
    (_, lt, loss_t), (_, lo, loss_o), _ = _step0(lab)
    assert counter.calls == 0  # nn.Linear's own F.linear
    assert (lt - lo).abs().max() < 1e-4 and abs(loss_t.item() - loss_o.item()) < 1e-5


def _linear_inputs(dtype: Any) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(5)
    # [B, T, K] activations, a non-square weight [N, K]: every transpose in the wiring shows
    return (torch.randn(2, 3, 7, generator=g, dtype=dtype),
            torch.randn(5, 7, generator=g, dtype=dtype))


def test_linear_custom_op_opcheck_and_gradcheck(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Schema, fake kernel and autograd registration of strata::linear and its backward on
    the real C matmul; gradcheck of the wiring through the float64 reference path."""
    lab = _lab(tmp_path_factory, "matmul-opcheck", 2.0)
    assert lab.lab_matmul
    x, w = _linear_inputs(torch.float32)
    torch.library.opcheck(ops_lab.linear, (x.requires_grad_(), w.requires_grad_()))
    torch.library.opcheck(ops_lab.linear_backward, (x.detach(), w.detach(),
                                                    torch.randn(2, 3, 5)))
    torch.testing.assert_close(ops_lab.linear(x, w), torch.nn.functional.linear(x, w))
    x64, w64 = (t.requires_grad_() for t in _linear_inputs(torch.float64))
    assert torch.autograd.gradcheck(ops_lab.linear, (x64, w64), eps=1e-6, atol=1e-6)
