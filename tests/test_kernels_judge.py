"""The kernel judge cannot be fooled or escaped: one cheating kernel per class (sandbox
escapes, load-time code, output inspection, caching and skipped work in timing loops, lower
precision, data races, out-of-bounds writes), each rejected with its own reason; the
noisy-baseline and roofline rules on recorded timings; an honest fast kernel still wins."""

from __future__ import annotations

import glob
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from strata.kernels import checks, confine, plausibility
from strata.kernels.dispatch import resolve, speed_of
from strata.kernels.impl import from_source
from strata.kernels.service import Session
from strata.kernels.verify import Verdict, VerifyContext, verify_many
from strata.store.kernels import KernelResult
from tests.conftest import FIXTURES

pytest.importorskip("torch")

ADVERSARIAL = FIXTURES / "kernels" / "adversarial"
ESCAPES = "/tmp/strata_escape_*"

# fixture -> reason it must be rejected with, runtime checks only (static checks off)
RUNTIME = {
    "declares_cpython.c": checks.FORBIDDEN_LINK,
    "declares_libc.c": checks.FORBIDDEN_LINK,
    "uses_dlsym.c": checks.FORBIDDEN_LINK,
    "load_time_constructor.c": checks.FORBIDDEN_LINK,
    "ifunc_resolver.c": checks.FORBIDDEN_LINK,
    "reads_output.c": checks.READS_OUTPUT,
    "reads_output.py": checks.READS_OUTPUT,
    "lower_precision.c": checks.WRONG_RESULT,
    "data_race.c": checks.DATA_RACE,
    "writes_past_end.c": checks.OUT_OF_BOUNDS,
    "writes_file.py": checks.SANDBOX_VIOLATION,
}
MESSAGE_HINT = {"declares_cpython.c": "PyRun_SimpleString", "declares_libc.c": "system",
                "uses_dlsym.c": "dlsym", "load_time_constructor.c": "constructor",
                "ifunc_resolver.c": "ifunc", "writes_file.py": "/tmp/strata_escape_triton"}


def _escaped() -> list[str]:
    return glob.glob(ESCAPES)


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Verdict]:
    """Every runtime cheat verified once (two sandboxes at a time), static checks off."""
    from strata.kernels.service import session
    from strata.store import open_db

    for leftover in _escaped():
        os.remove(leftover)
    home = tmp_path_factory.mktemp("judge-home")
    old = os.environ.get("STRATA_HOME")
    os.environ["STRATA_HOME"] = str(home)
    try:
        s = session(conn=open_db(home / "strata.db"))
        impls = [from_source(ADVERSARIAL / n, origin="external") for n in RUNTIME]
        ctx = VerifyContext(s.conn, s.fingerprint, s.caps, static=False)
        verdicts = verify_many(impls, ctx, jobs=2)
    finally:
        if old is None:
            os.environ.pop("STRATA_HOME", None)
        else:
            os.environ["STRATA_HOME"] = old
    return dict(zip(RUNTIME, verdicts, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNTIME))
def test_each_cheat_class_is_rejected_with_its_reason(name: str,
                                                      judged: dict[str, Verdict]) -> None:
    v = judged[name]
    assert (v.status, v.reason) == ("fail", RUNTIME[name]), v.to_dict()
    if name in MESSAGE_HINT:
        assert MESSAGE_HINT[name] in v.message + " ".join(v.details), v.to_dict()


@pytest.mark.slow
def test_no_cheat_wrote_outside_its_scratch_directory(judged: dict[str, Verdict]) -> None:
    assert judged  # the fixture ran every cheat, including the ones that try to write
    assert _escaped() == []


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the raw syscall is x86_64 asm")
@pytest.mark.skipif(confine.landlock_abi() == 0, reason="no Landlock in this kernel: nothing "
                    "below the static check would stop a raw syscall (the verdict says so)")
def test_raw_syscall_is_refused_statically_and_held_by_the_os(
        kernel_session: Session) -> None:
    impl = from_source(ADVERSARIAL / "raw_syscall.c", origin="external")
    ctx = VerifyContext(kernel_session.conn, kernel_session.fingerprint, kernel_session.caps)
    assert verify_many([impl], ctx)[0].reason == checks.STATIC_CHECK
    ctx.static, ctx.force = False, True
    verdict = verify_many([impl], ctx)[0]  # no import to refuse: only the OS layer is left
    assert verdict.sandbox and verdict.sandbox.startswith("landlock"), verdict.to_dict()
    assert not os.path.exists("/tmp/strata_escape_asm")


@pytest.mark.slow
def test_timing_loop_cheats_lose_dispatch_and_an_honest_kernel_wins(
        kernel_session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """Caching by pointer and skipping work after many calls pass verification (or not:
    allocators reuse addresses), but never the benchmark: timed calls get new inputs in
    reused buffers and their outputs are checked. The built-in C kernels still win."""
    from strata.kernels.bench import BenchContext, BenchSettings, bench_op
    from strata.kernels.registry import implementations
    from strata.kernels.sandbox import SandboxPolicy

    s = kernel_session
    cheats = [from_source(ADVERSARIAL / n, origin="external")
              for n in ("pointer_cache.c", "skips_when_timed.c")]
    honest = [i for i in implementations("silu_mul", s.conn) if i.dialect == "c"]
    vctx = VerifyContext(s.conn, s.fingerprint, s.caps, static=False)
    settings = BenchSettings(shapes="figure", compile=False, max_time_s=0.05, min_reps=3,
                             max_reps=40)
    figures = bench_op("silu_mul", [*honest, *cheats],
                       BenchContext(vctx, None, settings, SandboxPolicy(timeout_s=600), 2))
    for cheat in cheats:
        timed = [f for f in figures if f.impl == cheat.name]
        verdict = verify_many([cheat], vctx)[0]
        assert verdict.status == "fail" or any(f.disqualified for f in timed), \
            [f.to_dict() for f in timed]
        assert all(f.speedup_eager is None for f in timed if f.disqualified)
    # dispatch judges from the stored rows: the cheats are rejected, an honest kernel wins
    from strata.kernels import dispatch

    monkeypatch.setattr(dispatch, "implementations",
                        lambda op, conn=None: [*implementations(op, conn), *cheats])
    decision = resolve("silu_mul", "cpu", s)
    assert decision.impl is None or decision.impl.origin == "builtin", decision.to_dict()
    cheat_reasons = {e.impl: e.reason for e in decision.trace
                     if e.impl in {c.name for c in cheats}}
    assert all(r.startswith(("wrong result", "failed verification"))
               for r in cheat_reasons.values()), cheat_reasons


# -- recorded timings: the rules themselves -------------------------------------------------

SHAPES = [{"rows": 1, "cols": 2048}, {"rows": 8, "cols": 2048}, {"rows": 1, "cols": 4096},
          {"rows": 8, "cols": 4096}]
# Recorded on this VM while other work shared its two cores: eager rmsnorm at 8x4096 took
# 10.7 ms (OpenMP team waiting for a descheduled thread) instead of ~0.6 ms.
EAGER_US = [(275.1, 64.2), (339.0, 59.8), (309.8, 50.9), (10745.1, 4801.7)]


def _times(recorded: list[tuple[float, float]]) -> list[plausibility.BaselineTime]:
    from strata.kernels.spec import get_spec

    spec = get_spec("rmsnorm")
    return [plausibility.BaselineTime(sh, med * 1e-6, (med - iqr / 2) * 1e-6,
                                      (med + iqr / 2) * 1e-6, spec.bytes(sh, 4))
            for sh, (med, iqr) in zip(SHAPES, recorded, strict=True)]


def test_a_noisy_baseline_is_named_and_the_clean_shapes_are_not() -> None:
    noisy = plausibility.noisy_shapes(_times(EAGER_US))
    assert list(noisy) == [3]
    assert "rows=8 cols=2048" in noisy[3]
    quiet = [*EAGER_US[:3], (610.0, 40.0)]
    assert plausibility.noisy_shapes(_times(quiet)) == {}


def test_an_iqr_wider_than_half_the_median_is_noisy() -> None:
    wide = [*EAGER_US[:3], (600.0, 400.0)]
    assert "IQR" in plausibility.noisy_shapes(_times(wide))[3]


def _row(shape: dict[str, int], speedup: float, flags: list[str] | None = None) -> KernelResult:
    return KernelResult("rmsnorm", "c.x", "h", "bench", "ok", "cpu", "float32",
                        {"speedup_eager": speedup, "flags": flags or []}, shape)


def test_a_noisy_shape_does_not_count_for_dispatch() -> None:
    honest = [_row(SHAPES[0], 8.4), _row(SHAPES[1], 8.1), _row(SHAPES[2], 9.8)]
    noisy = _row(SHAPES[3], 212.8, [f"{plausibility.NOISY_BASELINE} (recorded)"])
    speed = speed_of([*honest, noisy])
    assert speed.excluded == 1 and speed.shapes == 3
    assert speed.geomean == pytest.approx((8.4 * 8.1 * 9.8) ** (1 / 3))
    assert speed.high == pytest.approx(9.8)  # not 212.8


def test_a_time_beyond_the_roofline_is_disqualified() -> None:
    # 4096x4096 fp32 matmul row block: 64 MiB of weights cannot stream in 0.5 ms at 32 GB/s
    nbytes, flops = 4096 * 4096 * 4.0, 2.0 * 8 * 4096 * 4096
    bound = plausibility.min_time_s(nbytes, flops, 32.4, 172.0, cold=True)
    assert bound == pytest.approx(nbytes / 32.4e9)
    assert plausibility.implausible(0.5e-3, bound) is not None
    assert plausibility.implausible(bound * 0.9, bound) is None  # within the margin
    flag = plausibility.implausible(0.5e-3, bound)
    speed = speed_of([_row(SHAPES[0], 1.3), _row(SHAPES[1], 318.0, [flag])])
    assert speed.geomean is None and speed.problem and "implausible" in speed.problem
    # warm caches: only the FLOP bound holds (the bytes may come from cache)
    assert plausibility.min_time_s(nbytes, flops, 32.4, 172.0, cold=False) == \
        pytest.approx(flops / 172e9)


# -- the OS layer on its own ------------------------------------------------------------------

PROBE = """
import os, socket, subprocess, sys
from strata.kernels import confine
c = confine.confine(confine.Plan(sys.argv[1]))
print("LEVEL", c.level)
def attempt(name, fn):
    try:
        fn(); print(name, "allowed")
    except OSError as e:
        print(name, "denied")
attempt("scratch", lambda: open(os.path.join(sys.argv[1], "ok"), "w").close())
attempt("outside", lambda: open(sys.argv[2], "w").close())
attempt("exec", lambda: subprocess.run(["true"]))
attempt("socket", lambda: socket.socket())
attempt("fork", lambda: os.fork())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="Landlock and seccomp are Linux")
def test_a_confined_process_writes_only_its_scratch_and_starts_nothing(tmp_path: Path) -> None:
    scratch, outside = tmp_path / "scratch", tmp_path / "outside.txt"
    scratch.mkdir()
    run = subprocess.run([sys.executable, "-c", PROBE, str(scratch), str(outside)],
                         capture_output=True, text=True, timeout=60)
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert lines["scratch"] == "allowed", run.stdout + run.stderr
    if confine.landlock_abi() > 0:
        assert lines["LEVEL"].startswith("landlock")
        assert lines["outside"] == "denied" and not outside.exists()
    assert {lines[k] for k in ("exec", "socket", "fork")} == {"denied"}, run.stdout


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")
def test_kernel_figures_timed_on_a_busy_host_say_so(kernel_session: Session) -> None:
    """A busy loop outside strata's process tree while the kernel lab times: every figure
    carries the busy-host verdict (stored with the row, shown in the note)."""
    from strata.kernels.bench import BenchContext, BenchSettings, bench_op
    from strata.kernels.registry import find
    from strata.kernels.sandbox import SandboxPolicy
    from tests.test_busy_host import _detached_spinner

    s = kernel_session
    vctx = VerifyContext(s.conn, s.fingerprint, s.caps)
    settings = BenchSettings(shapes="verify", compile=False, max_time_s=0.02, max_reps=20)
    ctx = BenchContext(vctx, None, settings, SandboxPolicy(timeout_s=600))
    with _detached_spinner():
        figures = bench_op("silu_mul", [find("silu_mul", "c.naive", s.conn)], ctx)
    assert figures
    for fig in figures:
        assert any(f.startswith("host busy: other processes used") for f in fig.flags), \
            fig.to_dict()


@pytest.mark.slow
def test_an_escape_in_the_benchmark_worker_is_named_too(kernel_session: Session) -> None:
    """The benchmark worker loads kernel code as well: an escape attempted there (here at
    load time) fails the job with its reason, not only in verification."""
    from strata.kernels.timing import BenchJob, run_candidates

    impl = from_source(ADVERSARIAL / "writes_at_load.py", origin="external")
    job = BenchJob("silu_mul", "cpu", "float32", [{"rows": 2, "cols": 8}],
                   {"warmup_s": 0.0, "min_reps": 1, "max_reps": 2, "max_time_s": 0.1},
                   1 << 20, "cold", 300.0)
    result = run_candidates(job, [impl], 0.0)
    if result.get("ok"):  # the load failed inside the job: the failure is the row's
        row = result["rows"][0]["results"][impl.name]
        result = {"failure": {"reason": row["error"].split(":")[0], "message": row["error"]}}
    assert result["failure"]["reason"] == checks.SANDBOX_VIOLATION, result
    assert "/tmp/strata_escape_load" in result["failure"]["message"]
    assert not os.path.exists("/tmp/strata_escape_load")
