"""hardware/threads.py: one thread team per process (torch's pool and the OpenMP runtime the
lab's C kernels link), one default, and `strata train` sizing both on the thread that runs
the steps."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from strata.errors import InputError  # noqa: E402
from strata.hardware import threads as hw_threads  # noqa: E402
from strata.hardware.profile import CpuInfo  # noqa: E402
from strata.hardware.threads import default_threads, set_threads  # noqa: E402
from strata.kernels.threads import ThreadControl  # noqa: E402

OMP = ThreadControl.for_dialect("c")
needs_omp = pytest.mark.skipif(not OMP.active, reason="no libgomp on this host")


def omp_threads() -> int | None:
    """The team size the lab's C kernels get on this thread (libgomp's ICV)."""
    return int(OMP.lib.omp_get_max_threads()) if OMP.active else None


@pytest.fixture(autouse=True)
def restore_teams() -> Iterator[None]:
    """Both counts are process-wide state: leave them as found for the next test."""
    torch_before, omp_before = torch.get_num_threads(), omp_threads()
    yield
    torch.set_num_threads(torch_before)
    if omp_before is not None:
        OMP.lib.omp_set_num_threads(omp_before)


@needs_omp
def test_set_threads_sizes_torch_and_the_openmp_team() -> None:
    assert set_threads(1) == 1
    assert (torch.get_num_threads(), omp_threads()) == (1, 1)
    assert set_threads(2) == 2
    assert (torch.get_num_threads(), omp_threads()) == (2, 2)


def test_the_one_default_is_omp_num_threads_else_the_physical_cores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from strata.hardware import cpu

    monkeypatch.setattr(cpu, "probe_cpu", lambda: CpuInfo("x86_64", physical_cores=3))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert default_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # nested teams: the outer one
    assert default_threads() == 4
    for unset in ("", "0", "lots"):
        monkeypatch.setenv("OMP_NUM_THREADS", unset)
        assert default_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert default_threads() == 3
    assert set_threads(None) == 3 and torch.get_num_threads() == 3


def test_a_count_under_one_is_refused() -> None:
    with pytest.raises(InputError, match="--threads 0"):
        set_threads(0)


def test_lab_load_and_the_torch_backend_use_the_one_function() -> None:
    """No second copy: the lab's loader and the torch backend import this module's."""
    import inspect

    import strata.backends.torch_backend as torch_backend
    import strata.lab as lab

    assert torch_backend.set_threads is hw_threads.set_threads
    assert "from strata.hardware.threads import set_threads" in inspect.getsource(lab.load)


class TeamSpy:
    """Progress that records, at every step, the thread and torch's team the step ran with."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def begin(self, steps: int, done: int) -> None: ...

    def step(self, s: Any) -> None:
        self.seen.append((threading.get_ident(), torch.get_num_threads()))

    def evaluated(self, e: Any) -> None: ...


class OpenMPSpy:
    """libgomp as the lab's C kernels see it, recording who sized the team. A spy, not the
    real count: where torch bundles a libgomp of the same soname (Linux pip wheels) its own
    set_num_threads moves the kernels' team too, so only the call itself tells whether train
    sized it — with libomp, Intel's runtime or a libgomp loaded first it would not."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def omp_set_num_threads(self, n: int) -> None:
        self.calls.append((threading.get_ident(), n))


def test_train_sizes_the_lab_kernels_openmp_team_with_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`strata train --threads 1` (in-process): the OpenMP team the lab's C kernels use is
    set to 1 on the thread that runs the steps, and every step runs with torch's team at 1."""
    from strata.train.distributed import World
    from strata.train.presets import PRESETS
    from strata.train.run import TrainConfig, make_ops, train
    from tests.test_train_loop import write_corpus

    omp = OpenMPSpy()
    monkeypatch.setattr(ThreadControl, "for_dialect",
                        classmethod(lambda cls, dialect: cls(omp, 2) if dialect == "c" else cls()))
    torch.set_num_threads(2)
    preset = replace(PRESETS["test"], steps=2, eval_every=100, ckpt_every=100)
    cfg = TrainConfig(preset, data=[write_corpus(tmp_path / "corpus", 6)], out=tmp_path / "run",
                      threads=1, export=False, sample_tokens=0)
    spy = TeamSpy()
    train(cfg, make_ops(cfg.kernels, torch.device("cpu")), spy, None, world=World())
    assert len(spy.seen) == 2 and {n for _, n in spy.seen} == {1}
    assert omp.calls == [(spy.seen[0][0], 1)]
