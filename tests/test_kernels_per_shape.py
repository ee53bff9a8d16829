"""Ops dispatched per call shape (spec.per_shape: the convolutions): a 7x7 stride-2 stem and a
3x3 block favour different kernels, so each new call shape is resolved from the benchmark at
that very shape. Recorded verification and benchmark rows in a real SQLite DB stand in for
the sandbox and the timer (their own tests are test_kernels_judge.py and the bench tests);
the kernels that then run are the real built-ins, checked against torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from strata.kernels import Choice
from strata.kernels.dispatch import KERNEL, VENDOR, resolve
from strata.kernels.registry import find
from strata.kernels.service import Session
from strata.kernels.spec import SPECS, get_spec, parse_shape, shape_label
from strata.store.kernels import KernelResult, save_kernel_results
from tests.conftest import run_cli

OP = "conv2d"
# two verify shapes of different kinds: a 7x7 stride-2 stem-like layer and a dense 3x3
STEM = {"N": 1, "H": 11, "W": 9, "C": 3, "O": 8, "K": 7, "G": 1, "S": 2, "P": 3}
BLOCK = {"N": 1, "H": 6, "W": 9, "C": 70, "O": 67, "K": 3, "G": 1, "S": 1, "P": 1}
# recorded speedups over torch eager: c.im2col wins the stem, c.naive the block
SPEEDS = {"c.im2col": {"STEM": 1.6, "BLOCK": 0.5}, "c.naive": {"STEM": 0.7, "BLOCK": 1.3}}


def _record(s: Session) -> None:
    for name, at in SPEEDS.items():
        impl = find(OP, name, s.conn)
        rows = [KernelResult(OP, name, impl.content_hash(), "verify", "pass", "cpu", "float32",
                             {"ok": True, "cases": 44})]
        rows += [KernelResult(OP, name, impl.content_hash(), "bench", "ok", "cpu", "float32",
                              {"speedup_eager": at[key], "flags": []}, shape)
                 for key, shape in (("STEM", STEM), ("BLOCK", BLOCK))]
        save_kernel_results(s.conn, s.fingerprint, rows)


def _reason(decision, impl: str) -> str:
    return next(e.reason for e in decision.trace if e.impl == impl)


def test_the_decision_at_a_shape_ranks_by_the_benchmark_at_that_shape(
        kernel_session: Session) -> None:
    s = kernel_session
    _record(s)
    whole = resolve(OP, "cpu", s)  # one kernel for all: geomeans 0.89x and 0.95x
    assert whole.outcome == VENDOR, whole.to_dict()
    stem, block = resolve(OP, "cpu", s, STEM), resolve(OP, "cpu", s, BLOCK)
    assert (stem.outcome, stem.chosen, stem.speedup) == (KERNEL, "c.im2col", 1.6)
    assert (block.outcome, block.chosen, block.speedup) == (KERNEL, "c.naive", 1.3)
    assert "at N=1, H=11" in _reason(stem, "c.im2col") and "benchmarked here" in \
        _reason(stem, "c.im2col")
    assert _reason(stem, "c.naive").startswith("slower: 0.70x torch eager at N=1, H=11")
    # an op that is not dispatched per shape keeps one kernel whatever the shape says
    assert not get_spec("matmul").per_shape and get_spec(OP).per_shape


def test_a_call_runs_the_kernel_fastest_at_its_shape(kernel_session: Session) -> None:
    s = kernel_session
    _record(s)
    spec = get_spec(OP)
    choice = Choice(resolve(OP, "cpu", s), spec, caps=s.caps, host=s)
    for shape, want in ((STEM, "c.im2col"), (BLOCK, "c.naive")):
        x, w, b, geom = spec.make_inputs(shape, "float32", 0, "cpu")
        out = torch.full(spec.out_shape(shape), float("nan"))
        choice(out, x, w, b, geom)
        ref = F.conv2d(x.double(), w.double(), b.double(), shape["S"], shape["P"])
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
        served = choice.for_call(out, (x, w, b, geom))
        assert served.shaped and served.decision.chosen == want, served.decision.to_dict()
    assert len(choice._by_shape) == 2  # each shape resolved once
    choice.close()


def test_explain_takes_a_shape_and_refuses_a_wrong_one(kernel_session: Session,
                                                        strata_home) -> None:
    _record(kernel_session)
    proc = run_cli("kernels", "explain", OP, "--shape", shape_label(STEM), "-o", "json",
                   home=strata_home)
    assert proc.returncode == 0, proc.stderr
    assert '"chosen": "c.im2col"' in proc.stdout
    bad = run_cli("kernels", "explain", OP, "--shape", "N=1 H=11", home=strata_home)
    assert bad.returncode == 2 and "takes the dims N H W C O K G S P" in bad.stderr
    assert parse_shape(SPECS[OP], shape_label(BLOCK)) == BLOCK
