"""The generation loop's stopping rules (kernels/gen/loop.py), on real Attempt records: the
turn cap, the same failure three times, and a correct kernel within 10% of the roofline
ceiling. Benchmarking a candidate to near its roofline takes minutes on a shared host, so the
rule that reads its roofline share is checked here, on the records the judge fills; the
end-to-end runs over loopback HTTP are in tests/test_kernels_generate.py."""

from __future__ import annotations

import pytest

from strata.kernels.gen.loop import AT_ROOFLINE, STUCK_AFTER, _stop_reason
from strata.kernels.gen.records import Attempt, Timing


def attempt(turn: int, status: str, *, share: float | None = None, reason: str = "",
            feedback: str = "") -> Attempt:
    timing = Timing(speedup_eager=2.0, roofline_share=share) if share is not None else Timing()
    return Attempt(op="rmsnorm", dialect="c", device="cpu", endpoint="http://x/v1",
                   model="m", template_hash="t", sample=0, turn=turn, prompt="[]", reply="",
                   status=status, reason=reason, feedback=feedback, timing=timing)


def test_the_rules_match_the_issue() -> None:
    assert (AT_ROOFLINE, STUCK_AFTER) == (0.9, 3)


@pytest.mark.parametrize(("share", "stops"), [(0.95, True), (0.9, True), (0.89, False),
                                              (0.3, False)])
def test_a_correct_kernel_stops_only_within_10_percent_of_the_roofline(
        share: float, stops: bool) -> None:
    for status in ("ok", "slow"):
        why = _stop_reason([attempt(1, status, share=share)], turns=6)
        assert (why == "within 10% of the roofline ceiling") is stops, (status, share, why)
        if not stops:
            assert why == ""  # correct but improvable: the next turn asks for more speed


def test_an_untimed_correct_kernel_ends_its_sample() -> None:
    assert _stop_reason([attempt(1, "ok")], turns=6).startswith("correct (not timed")


def test_the_same_failure_three_times_in_a_row() -> None:
    same = [attempt(t, "compile", reason="build_failed", feedback="It did not compile.\nx")
            for t in (1, 2, 3)]
    assert _stop_reason(same[:2], turns=6) == ""
    assert _stop_reason(same, turns=6) == "the same compile failure 3 times"
    # a different first feedback line is progress (another error), not the same failure
    moved = [*same[:2], attempt(3, "compile", reason="build_failed", feedback="Other.\nx")]
    assert _stop_reason(moved, turns=6) == ""
    # a correct turn in between breaks the run of failures
    broken = [same[0], attempt(2, "ok", share=0.2), same[2]]
    assert _stop_reason(broken, turns=6) == ""


def test_the_turn_cap() -> None:
    turns = [attempt(1, "format", feedback="a"), attempt(2, "mismatch", feedback="b"),
             attempt(3, "ok", share=0.5)]
    assert _stop_reason(turns[:2], turns=3) == ""
    assert _stop_reason(turns, turns=3) == "turn cap"
