"""The training loop on the tiny `test` preset: the schedule, gradient accumulation, exact
resume after a real SIGINT, and data parallelism (2 gloo processes on loopback under
torchrun) against one process with the same global batch."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from strata.train.checkpoint import load_checkpoint
from strata.train.data import Batches
from strata.train.distributed import World
from strata.train.loop import Quiet, make_optimizer
from strata.train.presets import PRESETS
from strata.train.run import TrainConfig, find_resume, make_ops, open_corpus, train
from strata.train.schedule import Schedule


def write_corpus(folder: Path, n_docs: int = 24) -> Path:
    """A few dozen KB of real prose (pydoc topics), one document per file."""
    from pydoc_data.topics import topics

    folder.mkdir(parents=True, exist_ok=True)
    for name in sorted(topics)[:n_docs]:
        (folder / f"{name}.txt").write_text(topics[name], encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def config(corpus: Path, out: Path, **preset: int) -> TrainConfig:
    p = replace(PRESETS["test"], **{"steps": 12, "eval_every": 4, "ckpt_every": 100, **preset})
    return TrainConfig(p, data=[corpus], out=out, threads=1, export=False, sample_tokens=4)


def run(cfg: TrainConfig, progress: object = None, resumed: object = None) -> object:
    ops = make_ops(cfg.kernels, torch.device(cfg.device))
    return train(cfg, ops, progress or Quiet(), None, resumed=resumed, world=World())


def test_schedule_warms_up_then_decays_to_the_floor() -> None:
    s = Schedule(lr=1.0, warmup=4, total=20)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    lrs = [s(i) for i in range(4, 20)]
    assert all(a > b for a, b in itertools.pairwise(lrs))  # strictly decreasing
    assert s(20) == s(10_000) == pytest.approx(0.1)
    assert lrs[-1] > 0.1


class StopAt(Quiet):
    """Sends this process a real SIGINT after step `k`, as Ctrl-C would."""

    def __init__(self, k: int) -> None:
        self.k = k

    def step(self, s: object) -> None:
        if s.step == self.k:  # type: ignore[attr-defined]
            os.kill(os.getpid(), signal.SIGINT)


def test_resume_after_sigint_repeats_the_uninterrupted_losses_exactly(corpus: Path,
                                                                     tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the suite runs in the background
    whole = run(config(corpus, tmp_path / "whole"))
    assert whole.completed and whole.step == 12
    reference = load_checkpoint(tmp_path / "whole").history

    stopped = run(config(corpus, tmp_path / "cut"), StopAt(5))
    assert not stopped.completed and stopped.step == 5
    resumed = find_resume(str(tmp_path / "cut"), None)
    assert resumed.checkpoint.step == 5
    cfg = TrainConfig.from_dict(resumed.checkpoint.config)
    again = run(cfg, resumed=resumed)
    assert again.completed and again.step == 12
    history = load_checkpoint(tmp_path / "cut").history
    # Same process, same threads, same op order: the losses are bit-for-bit equal.
    assert history.train == reference.train
    assert history.val == reference.val
    assert [s for s, *_ in history.train] == list(range(1, 13))
    # the signal handlers are back to what they were
    assert signal.getsignal(signal.SIGINT) is before


def test_gradient_accumulation_equals_the_mean_of_the_micro_batch_gradients(
        corpus: Path, tmp_path: Path) -> None:
    """One optimizer step of accum=2 against the same step written out by hand."""
    cfg = config(corpus, tmp_path / "acc", steps=1, accum=2, eval_every=1)
    run(cfg)
    trained = load_checkpoint(tmp_path / "acc").model

    data = open_corpus(tmp_path / "acc")
    from strata.train.run import build_model, model_config

    model = build_model(cfg, model_config(cfg.preset, data.tokenizer),
                        make_ops("torch", torch.device("cpu")), torch.device("cpu"))
    opt = make_optimizer(model, cfg.preset)
    for g in opt.param_groups:
        g["lr"] = Schedule(cfg.preset.lr, cfg.preset.warmup, cfg.preset.steps)(0)
    batches = Batches(data.store.train, cfg.preset.batch, model.cfg.ctx, cfg.seed)
    losses = [model(*batches.next())[1] for _ in range(2)]
    ((losses[0] + losses[1]) / 2).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.preset.grad_clip)
    opt.step()
    moved = 0
    # The loop backpropagates each micro-batch's loss / 2 into the summed gradients, this
    # one (loss_0 + loss_1) / 2 at once: rounding differs (measured 1.6e-7 at most); a step
    # moves a weight by ~lr (5e-3 here), so 1e-6 still catches a lost micro-batch.
    for name, value in model.state_dict().items():
        torch.testing.assert_close(trained[name], value, rtol=0, atol=1e-6)
        moved += int(not torch.equal(value, build_model(
            cfg, model.cfg, make_ops("torch", torch.device("cpu")),
            torch.device("cpu")).state_dict()[name]))
    assert moved > 0  # the step changed the weights


def _cli_env(home: Path) -> dict[str, str]:
    return {**os.environ, "STRATA_HOME": str(home), "OMP_NUM_THREADS": "1"}


def test_two_gloo_processes_follow_one_process_with_the_same_global_batch(
        corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.seed_host import seeded_home

    home = seeded_home(tmp_path_factory, "ddp")
    flags = ["--preset", "test", "--data", str(corpus), "--steps", "8", "--batch", "4",
             "--accum", "2", "--eval-every", "4", "--threads", "1", "--no-export"]
    one = subprocess.run([sys.executable, "-m", "strata.train", *flags, "--out",
                          str(home / "one")], env=_cli_env(home), capture_output=True,
                         text=True, timeout=180)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "-m", "strata.train", *flags, "--out",
                          str(home / "two")], env=_cli_env(home), capture_output=True,
                         text=True, timeout=180)
    assert two.returncode == 0, two.stdout + two.stderr
    a = load_checkpoint(home / "one").history
    b = load_checkpoint(home / "two").history
    assert [s for s, *_ in a.train] == [s for s, *_ in b.train] == list(range(1, 9))
    # Same rows, same weights: only the order of float sums differs (two half-batch means
    # averaged vs one mean; DDP sums gradients across ranks), so equal to float32 rounding
    # amplified over a few Adam steps, far below the step-to-step change of the loss.
    for (_, la, _), (_, lb, _) in zip(a.train, b.train, strict=True):
        assert lb == pytest.approx(la, rel=1e-5, abs=1e-5)
    for (_, va, _), (_, vb, _) in zip(a.val, b.val, strict=True):
        assert vb == pytest.approx(va, rel=1e-5, abs=1e-5)
    assert "2 process(es)" in two.stderr  # rank 0 only prints (once)
    assert two.stderr.count("run ") == 1
