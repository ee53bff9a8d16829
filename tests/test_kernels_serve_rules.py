"""What an external kernel must have before dispatch serves it ("Trust the judge"): a
benchmark, not only a verdict; only the shapes it was verified and benchmarked at; and, to
run in the user's own process, the user's explicit trust in its exact bytes. Recorded rows
in a real SQLite DB stand in for the sandbox (its own tests are test_kernels_judge.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from strata.kernels.bench import WRONG_AT_SHAPE
from strata.kernels.dispatch import FALLBACK, KERNEL, VENDOR, Decision, coverage_of, resolve
from strata.kernels.impl import Implementation
from strata.kernels.plausibility import NOISY_BASELINE
from strata.kernels.registry import find
from strata.kernels.service import Session, add_external, list_records, register_external
from strata.kernels.spec import get_spec
from strata.store.kernels import (
    KernelResult,
    is_trusted,
    save_kernel_results,
    trust_of,
    verified_shapes,
)
from tests.conftest import FIXTURES, home_db, run_cli

HONEST = FIXTURES / "kernels" / "adversarial" / "honest_rmsnorm.c"
NAME = "c.ext.honest_rmsnorm"
BUILTIN = "c.naive"
BENCH_SHAPE = {"rows": 8, "cols": 4096}


def _external(s: Session, folder: Path, extra: str = "") -> Implementation:
    """honest_rmsnorm.c added as `strata kernels add` adds it (private copy, registered);
    `extra` changes its bytes as an edited file would."""
    src = folder / "honest_rmsnorm.c"
    shutil.copyfile(HONEST, src)
    if extra:
        src.write_text(src.read_text() + extra)
    impl = add_external(s, src)
    register_external(s, impl, src)
    assert impl.origin == "external" and impl.name == NAME
    return impl


def _verify(s: Session, impl: Implementation, status: str = "pass",
            shapes: list[dict[str, int]] | None = None) -> None:
    data: dict[str, object] = {"ok": status == "pass", "cases": 12}
    if shapes is not None:  # what the new verifier records; older rows lack it
        data["shapes"] = shapes
    if status != "pass":
        data["failure"] = {"reason": "wrong_result", "message": "rows=3 cols=7: off by 1e-2"}
    save_kernel_results(s.conn, s.fingerprint, [KernelResult(
        impl.op, impl.name, impl.content_hash(), "verify", status, "cpu", "float32", data)])


def _bench(s: Session, impl: Implementation, speedup: float,
           shapes: tuple[dict[str, int], ...] = (BENCH_SHAPE,), flags: list[str] | None = None,
           status: str = "ok") -> None:
    save_kernel_results(s.conn, s.fingerprint, [KernelResult(
        impl.op, impl.name, impl.content_hash(), "bench", status, "cpu", "float32",
        {"speedup_eager": speedup, "flags": flags or []}, shape) for shape in shapes])


def _decide(s: Session, shape: dict[str, int] | None = None) -> Decision:
    return resolve("rmsnorm", "cpu", s, shape)


def _why(decision: Decision, impl: str) -> tuple[str, str]:
    [entry] = [e for e in decision.trace if e.impl == impl]
    return entry.verdict, entry.reason


# -- no serving without a benchmark ----------------------------------------------------------

def test_an_external_kernel_verified_but_never_benchmarked_does_not_serve(
        kernel_session: Session, tmp_path: Path) -> None:
    s = kernel_session
    ext = _external(s, tmp_path)
    _verify(s, ext)
    decision = _decide(s)
    assert decision.outcome == FALLBACK and decision.impl is None, decision.to_dict()
    assert _why(decision, NAME) == ("rejected", "verified, not benchmarked: an external "
                                    "kernel serves only after strata kernels bench rmsnorm")
    assert "serves once benchmarked" in decision.trace[-1].reason
    # a built-in verified, never benchmarked still serves (the -B lab backend relies on it)
    builtin = find("rmsnorm", BUILTIN, s.conn)
    _verify(s, builtin)
    decision = _decide(s)
    assert (decision.outcome, decision.chosen) == (KERNEL, BUILTIN), decision.to_dict()
    assert decision.coverage is None and not decision.confined
    assert _why(decision, NAME)[0] == "rejected"
    # nor does it outrank the vendor path
    _bench(s, builtin, 0.8)
    decision = _decide(s)
    assert decision.outcome == VENDOR and _why(decision, NAME)[0] == "rejected"


def test_once_benchmarked_an_external_kernel_can_win(kernel_session: Session,
                                                     tmp_path: Path) -> None:
    s = kernel_session
    ext, builtin = _external(s, tmp_path), find("rmsnorm", BUILTIN, s.conn)
    for impl, speedup in ((ext, 2.0), (builtin, 1.2)):
        _verify(s, impl)
        _bench(s, impl, speedup)
    decision = _decide(s)
    assert (decision.outcome, decision.chosen) == (KERNEL, NAME), decision.to_dict()
    assert decision.speedup == pytest.approx(2.0) and decision.confined
    verdict, reason = _why(decision, NAME)
    assert verdict == "chosen" and reason.startswith("verified, fastest: 2.00x torch eager")
    assert "margin 0" in reason and "(runs confined: shared memory, its own process)" in reason
    assert _why(decision, BUILTIN) == ("rejected", "slower: 1.20x torch eager")
    record = decision.to_dict()
    assert record["confined"] is True and record["coverage"]["cols"] == [1, 4096]


def test_benchmarked_only_on_a_noisy_baseline_is_not_benchmarked_enough(
        kernel_session: Session, tmp_path: Path) -> None:
    s = kernel_session
    ext = _external(s, tmp_path)
    _verify(s, ext)
    _bench(s, ext, 40.0, flags=[f"{NOISY_BASELINE} (recorded)"])
    verdict, reason = _why(_decide(s), NAME)
    assert verdict == "rejected" and "noisy" in reason and "strata kernels bench" in reason


def test_a_later_failing_verification_rejects_what_passed_before(kernel_session: Session,
                                                                tmp_path: Path) -> None:
    s = kernel_session
    ext = _external(s, tmp_path)
    _verify(s, ext, shapes=[{"rows": 2, "cols": 64}])
    _bench(s, ext, 3.0)
    assert _decide(s).chosen == NAME
    _verify(s, ext, "fail")
    decision = _decide(s)
    assert decision.chosen != NAME
    verdict, reason = _why(decision, NAME)
    assert verdict == "rejected" and reason.startswith("failed verification: wrong_result")


# -- only the shapes it was proven at ----------------------------------------------------------

def test_coverage_is_the_union_of_verified_and_benchmarked_shapes(kernel_session: Session,
                                                                  tmp_path: Path) -> None:
    s = kernel_session
    ext = _external(s, tmp_path)
    _verify(s, ext, shapes=[{"rows": 2, "cols": 64}, {"rows": 3, "cols": 7}])
    _verify(s, ext, shapes=[{"rows": 512, "cols": 100}])  # on demand, at a new shape
    _bench(s, ext, 2.0, shapes=({"rows": 1, "cols": 2048}, {"rows": 8, "cols": 4096}))
    decision = _decide(s)
    assert decision.chosen == NAME
    assert decision.coverage == {"rows": (1, 512), "cols": (7, 4096)}
    assert decision.uncovered({"rows": 512, "cols": 4096}) is None
    assert decision.uncovered({"rows": 513, "cols": 64}) == \
        "rows=513 is outside the verified range 1..512"
    assert decision.uncovered({"rows": 4, "cols": 5}) == \
        "cols=5 is outside the verified range 7..4096"
    assert "never verified" in str(decision.uncovered({"rows": 4, "heads": 2}))


def test_a_verification_without_recorded_shapes_counts_the_ops_verify_set(
        kernel_session: Session, tmp_path: Path) -> None:
    s = kernel_session
    ext = _external(s, tmp_path)
    _verify(s, ext)  # written before verifications recorded their shapes
    _bench(s, ext, 2.0, shapes=({"rows": 4096, "cols": 4096},))
    verify_set = get_spec("rmsnorm").shapes["verify"]
    assert _decide(s).coverage == coverage_of([*verify_set, {"rows": 4096, "cols": 4096}])


def test_disqualified_or_failed_benchmark_rows_prove_no_shape(kernel_session: Session,
                                                              tmp_path: Path) -> None:
    s = kernel_session
    ext = _external(s, tmp_path)
    _verify(s, ext, shapes=[{"rows": 2, "cols": 64}])
    _bench(s, ext, 2.0, shapes=({"rows": 1, "cols": 9000},),
           flags=[f"{WRONG_AT_SHAPE}: recorded"])
    _bench(s, ext, 2.0, shapes=({"rows": 100, "cols": 9000},), status="error")
    _bench(s, ext, 2.0, shapes=({"rows": 8, "cols": 128},),
           flags=[f"{NOISY_BASELINE} (recorded)"])  # noisy: outputs were still checked
    shapes = verified_shapes(s.conn, s.fingerprint, "rmsnorm", NAME, ext.content_hash(), "cpu",
                             [], (WRONG_AT_SHAPE,))
    assert shapes == [{"rows": 2, "cols": 64}, {"rows": 8, "cols": 128}]
    # another device, another version: nothing
    assert verified_shapes(s.conn, s.fingerprint, "rmsnorm", NAME, "other", "cpu", []) == []


def test_resolving_for_a_shape_outside_the_range_passes_the_external_kernel_over(
        kernel_session: Session, tmp_path: Path) -> None:
    s = kernel_session
    ext, builtin = _external(s, tmp_path), find("rmsnorm", BUILTIN, s.conn)
    _verify(s, ext, shapes=[{"rows": 1, "cols": 64}, {"rows": 8, "cols": 64}])
    _bench(s, ext, 3.0, shapes=({"rows": 8, "cols": 2048},))
    _verify(s, builtin)
    _bench(s, builtin, 1.1)
    assert _decide(s, {"rows": 4, "cols": 1000}).chosen == NAME
    decision = _decide(s, {"rows": 512, "cols": 1000})
    assert decision.chosen == BUILTIN and decision.uncovered({"rows": 512}) is None
    verdict, reason = _why(decision, NAME)
    assert verdict == "rejected"
    assert reason.startswith("rows=512 is outside the verified range 1..8") and \
        "margin 0" in reason


# -- trust: in-process only when the user says so ------------------------------------------------

def _trust_rows(home: Path) -> list[tuple[str, ...]]:
    db = home_db(home)
    try:
        return [tuple(r) for r in db.execute("SELECT key, source_hash FROM kernel_trust")]
    finally:
        db.close()


def test_trust_round_trip_through_the_cli(kernel_session: Session, strata_home: Path,
                                          tmp_path: Path) -> None:
    s = kernel_session
    ext = _external(s, tmp_path)
    _verify(s, ext)
    _bench(s, ext, 2.0)
    assert _decide(s).confined and not is_trusted(s.conn, ext)

    proc = run_cli("kernels", "trust", NAME, "--note", "read it", home=strata_home)
    assert proc.returncode == 0, proc.stderr
    [risk] = proc.stderr.strip().splitlines()
    assert risk.startswith(f"trusting {NAME}: its code will run inside your own processes")
    assert "outside any sandbox" in risk
    assert proc.stdout.startswith(f"trusted rmsnorm/{NAME} in-process")
    assert is_trusted(s.conn, ext) and trust_of(s.conn, ext).note == "read it"
    decision = _decide(s)
    assert decision.chosen == NAME and not decision.confined
    assert "(trusted in-process since 20" in _why(decision, NAME)[1]
    assert [r["trust"] for r in list_records(s, "rmsnorm") if r["impl"] == NAME] == ["trusted"]

    # the user's file changes and is added again: these bytes were never trusted
    changed = _external(s, tmp_path, extra="\n// edited\n")
    assert changed.source != ext.source and not is_trusted(s.conn, changed)
    _verify(s, changed)
    _bench(s, changed, 2.0)
    assert _decide(s).confined

    proc = run_cli("kernels", "trust", f"rmsnorm/{NAME}", "--revoke", home=strata_home)
    assert proc.returncode == 0 and proc.stdout.startswith(f"revoked trust in rmsnorm/{NAME}")
    assert _trust_rows(strata_home) == []
    again = run_cli("kernels", "trust", NAME, "--revoke", home=strata_home)
    assert again.returncode == 0 and "was not trusted" in again.stdout


@pytest.mark.parametrize(("name", "why"), [("c.naive", "always runs in-process"),
                                           ("rmsnorm/c.naive", "always runs in-process"),
                                           ("c.ext.never_added", "no kernel added")])
def test_trust_refuses_a_built_in_or_unknown_name(strata_home: Path, name: str,
                                                  why: str) -> None:
    proc = run_cli("kernels", "trust", name, home=strata_home)
    assert proc.returncode == 2, proc.stdout
    assert why in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "outside any sandbox" not in proc.stderr  # no risk stated for nothing done


def test_remove_drops_the_trust(kernel_session: Session, tmp_path: Path) -> None:
    from strata.kernels.service import remove_kernel, trust_kernel

    s = kernel_session
    ext = _external(s, tmp_path)
    [change] = trust_kernel(s.conn, NAME)
    assert change.trusted and is_trusted(s.conn, ext)
    remove_kernel(s.conn, NAME)
    assert s.conn.execute("SELECT COUNT(*) FROM kernel_trust").fetchone()[0] == 0
    _external(s, tmp_path)  # added again: confined until trusted again
    assert [r["trust"] for r in list_records(s, "rmsnorm") if r["impl"] == NAME] == \
        ["confined"]


def test_kernels_list_names_how_each_kernel_runs(kernel_session: Session,
                                                 tmp_path: Path) -> None:
    """Every list record follows docs/output.md (kernels.list); the table's origin cell
    says confined or trusted for an external kernel."""
    from rich.console import Console

    from strata.views.kernels import list_table
    from tests.test_output_schema import check

    s = kernel_session
    _external(s, tmp_path)
    records = list_records(s, "rmsnorm")
    for r in records:
        check(r, "kernels.list")
    trust = {r["impl"]: r["trust"] for r in records}
    assert trust[NAME] == "confined" and trust[BUILTIN] is None
    console = Console(width=250, record=True)
    console.print(list_table(records))
    assert "external, confined" in console.export_text()
