"""Metrics obey their definitions on recorded timestamps; scenario flags parse like llama-bench."""

from __future__ import annotations

from typing import Any

import pytest

from strata.backends.base import RunTrace
from strata.bench.metrics import compute
from strata.bench.scenario import BenchTest, build_tests, parse_int_list, parse_pairs
from strata.errors import InputError

MS = 1_000_000  # ns per ms


def test_in_process_pp_tg_trace() -> None:
    # prompt of 100 tokens prefilled in 200 ms, then 4 decode steps of 10, 20, 10, 20 ms
    t = RunTrace(n_prompt=100, n_gen=4, t_start=0, t_prefill_end=200 * MS,
                 token_ns=[210 * MS, 230 * MS, 240 * MS, 260 * MS])
    m = compute(t)
    assert m.prefill_tps == pytest.approx(100 / 0.2)
    assert m.ttft_s == pytest.approx(0.2)
    assert m.decode_tps == pytest.approx(4 / 0.06)
    assert m.itl_s == pytest.approx([0.01, 0.02, 0.01, 0.02])
    assert m.e2e_s == pytest.approx(0.26)
    assert m.tpot_s == pytest.approx((0.26 - 0.2) / 3)
    assert m.combined_tps == pytest.approx(104 / 0.26)


def test_pure_tg_trace() -> None:
    t = RunTrace(n_prompt=0, n_gen=3, t_start=1000 * MS, t_prefill_end=None,
                 token_ns=[1010 * MS, 1020 * MS, 1030 * MS])
    m = compute(t)
    assert m.prefill_tps is None and m.combined_tps is None
    assert m.decode_tps == pytest.approx(3 / 0.03)
    assert m.ttft_s == pytest.approx(0.01)


def test_streamed_trace_with_multi_token_chunks() -> None:
    # HTTP: no observable prefill end; first chunk (1 token) at 300 ms, then 2-token chunks
    t = RunTrace(n_prompt=50, n_gen=5, t_start=0, t_prefill_end=None,
                 token_ns=[300 * MS, 340 * MS, 380 * MS], chunk_tokens=[1, 2, 2])
    m = compute(t)
    assert m.ttft_s == pytest.approx(0.3)
    assert m.prefill_tps == pytest.approx(50 / 0.3)
    assert m.decode_tps == pytest.approx(4 / 0.08)  # 4 tokens after the first, in 80 ms
    assert m.tpot_s == pytest.approx((0.38 - 0.3) / 4)


def test_pp_only_and_bad_traces() -> None:
    m = compute(RunTrace(n_prompt=10, n_gen=0, t_start=0, t_prefill_end=50 * MS))
    assert m.prefill_tps == pytest.approx(200) and m.decode_tps is None
    with pytest.raises(ValueError):
        compute(RunTrace(n_prompt=0, n_gen=2, t_start=0, t_prefill_end=None,
                         token_ns=[20 * MS, 10 * MS]))


def test_lists_and_ranges() -> None:
    assert parse_int_list("-p", "128,512") == [128, 512]
    assert parse_int_list("-t", "1-4") == [1, 2, 3, 4]
    assert parse_int_list("-p", "128-1024*2") == [128, 256, 512, 1024]
    assert parse_int_list("-d", "0-64+32") == [0, 32, 64]
    assert parse_int_list("-p", "none") == []
    assert parse_pairs("--pg", ["512,128"]) == [(512, 128)]


@pytest.mark.parametrize("flag,text,minimum", [("-p", "0", 1), ("-d", "-5", 0),
                                               ("-p", "abc", 1), ("-p", "10-1", 1),
                                               ("-p", "1-100000000", 1), ("-p", "2-8*1", 1)])
def test_bad_lists_are_input_errors(flag: str, text: str, minimum: int) -> None:
    with pytest.raises(InputError, match=flag):
        parse_int_list(flag, text, minimum)


def test_test_names_and_order() -> None:
    tests = build_tests([512], [128], [(512, 128)], [0, 1024])
    assert [t.name for t in tests] == ["pp512", "pp512 @ d1024", "tg128", "tg128 @ d1024",
                                       "pp512+tg128", "pp512+tg128 @ d1024"]
    assert BenchTest(0, 128).primary_metric == "decode_tps"
    assert BenchTest(512, 128, 64).context == 704
    with pytest.raises(InputError):
        build_tests([], [], [], [0])


def test_model_sizes_below_a_million_read_in_thousands() -> None:
    from strata.bench.records import params_text

    assert [params_text(p) for p in (260_000, 134_515_008, 1_235_814_400, 999)] == \
        ["260K", "135M", "1.2B", "999"]


def _threaded(threads: int, tps: float, busy: bool) -> Any:
    from strata.store.runs import StoredResult

    return StoredResult(
        model="m", backend="llamacpp", test="tg16", n_prompt=0, n_gen=16, n_depth=0,
        load_config={"threads": threads}, info={"threads": threads, "notes": []},
        metrics={"decode_tps": {"mean": tps, "sd": 0.1, "n": 3}},
        explain={"verdict": ["decode η 0.20 < 0.4: far below the roofline — suspect a slow "
                             "backend path for this dtype, too few threads, or throttling"]},
        telemetry={"host_load": {"busy": busy}})


def test_a_busy_thread_sweep_where_fewer_threads_won_says_so() -> None:
    from strata.bench.runner import busy_thread_notes

    one, two = _threaded(1, 30.0, True), _threaded(2, 18.0, True)
    changed = busy_thread_notes([one, two])
    assert changed == [one, two]
    for r in (one, two):
        assert any("on this busy host 1 thread(s) beat 2" in n for n in r.info["notes"])
        assert "too few threads" not in r.explain["verdict"][0]
    # quiet host, or more threads winning: nothing said
    assert busy_thread_notes([_threaded(1, 30.0, False), _threaded(2, 18.0, False)]) == []
    assert busy_thread_notes([_threaded(1, 18.0, True), _threaded(2, 30.0, True)]) == []
