"""η from exact byte counts, hand-computed for a tiny model; sustained-drop arithmetic."""

from __future__ import annotations

import pytest

from strata.bench.explain import explain
from strata.bench.scenario import BenchTest
from strata.bench.sustained import summarize_timeline
from strata.measure.roofline import DeviceRoofline, Figure
from strata.models.spec import ModelSpec, TensorInfo

# A 1-layer model, hidden 64, ffn 128, 4 heads of 16, 2 KV heads, vocab 256, q8_0 matrices:
# a q8_0 row of 64 values is 2 blocks x 34 bytes = 68 bytes; of 128 values, 136 bytes.
TENSORS = [
    TensorInfo("token_embd.weight", (256, 64), "Q8_0", 256 * 68),
    TensorInfo("blk.0.attn_norm.weight", (64,), "F32", 256),
    TensorInfo("blk.0.attn_q.weight", (64, 64), "Q8_0", 64 * 68),
    TensorInfo("blk.0.attn_k.weight", (32, 64), "Q8_0", 32 * 68),
    TensorInfo("blk.0.attn_v.weight", (32, 64), "Q8_0", 32 * 68),
    TensorInfo("blk.0.attn_output.weight", (64, 64), "Q8_0", 64 * 68),
    TensorInfo("blk.0.ffn_norm.weight", (64,), "F32", 256),
    TensorInfo("blk.0.ffn_gate.weight", (128, 64), "Q8_0", 128 * 68),
    TensorInfo("blk.0.ffn_up.weight", (128, 64), "Q8_0", 128 * 68),
    TensorInfo("blk.0.ffn_down.weight", (64, 128), "Q8_0", 64 * 136),
    TensorInfo("output_norm.weight", (64,), "F32", 256),
    TensorInfo("output.weight", (256, 64), "Q8_0", 256 * 68),
]


def _spec(tied: bool) -> ModelSpec:
    tensors = [t for t in TENSORS if not (tied and t.name == "output.weight")]
    return ModelSpec(name="hand", arch="llama", n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16,
                     hidden=64, ffn=128, vocab=256, ctx_max=512, tied_embeddings=tied,
                     tensors=tensors)


def test_bytes_per_token_by_hand() -> None:
    spec = _spec(tied=False)
    # untied: the embedding table is a lookup — one 68-byte row, not 256 rows
    layer = (64 + 32 + 32 + 64 + 128 + 128) * 68 + 64 * 136 + 2 * 256
    head = 256 + 256 * 68  # output norm + output matrix
    assert spec.streamed_weight_bytes() == 68 + layer + head
    # KV at context 100, f16: 2 x 1 layer x 2 kv heads x 16 dims x 100 x 2 bytes = 12800
    assert spec.kv_bytes(100, 2.0) == 12800
    tied = _spec(tied=True)
    assert tied.streamed_weight_bytes() == 256 * 68 + layer + 256  # head streams the table


def test_eta_and_bound_from_exact_bytes() -> None:
    spec = _spec(tied=False)
    roof = DeviceRoofline("cpu", "x", bandwidth={"triad": Figure(10.0, "m")},
                          compute={"fp32": Figure(100.0, "m")})
    test = BenchTest(0, 64, depth=68)  # decoding from context 68 to 132: average 100
    achieved = 1000.0
    ex = explain(spec, test, roof, "f16", None, {"decode_tps": achieved})
    expected_bytes = spec.streamed_weight_bytes() + 12800
    assert ex.bytes_per_token == expected_bytes
    assert ex.decode_ceiling_tps == pytest.approx(10e9 / expected_bytes)
    assert ex.decode_eta == pytest.approx(achieved / (10e9 / expected_bytes))
    assert ex.compute_dtype == "fp32"  # no int8 figure measured: fall back to fp32
    assert ex.bound == "memory"  # one token per weight pass: far below the ridge point
    pp = explain(spec, BenchTest(4096, 0), roof, "f16", None, {"prefill_tps": 1.0})
    assert pp.bound == "compute"  # 4096 tokens per weight pass


def test_eta_verdicts_are_flagged() -> None:
    spec = _spec(tied=False)
    roof = DeviceRoofline("cpu", "x", bandwidth={"read": Figure(1.0, "m")})
    ceiling = 1e9 / spec.bytes_per_decoded_token(32, 2.0)
    fast = explain(spec, BenchTest(0, 64), roof, "f16", None, {"decode_tps": ceiling * 2})
    assert any("faster than the roofline" in v for v in fast.verdict)
    slow = explain(spec, BenchTest(0, 64), roof, "f16", None, {"decode_tps": ceiling * 0.1})
    assert any("far below" in v for v in slow.verdict)


def test_runtime_dtype_reprices_weights() -> None:
    spec = _spec(tied=False)
    roof = DeviceRoofline("cpu", "x", bandwidth={"read": Figure(1.0, "m")})
    ex = explain(spec, BenchTest(0, 8), roof, "float32", "float32", {})
    assert ex.weight_bytes_per_token == spec.active_params() * 4


def test_sustained_drop() -> None:
    timeline = [(float(t), 100.0 if t < 30 else 80.0) for t in range(1, 121)]
    rep = summarize_timeline(timeline, 120.0)
    assert rep.window_s == 60.0
    assert rep.first_tps == pytest.approx((29 * 100 + 32 * 80) / 61)  # t in [1, 61]
    assert rep.last_tps == pytest.approx(80.0)
    assert rep.drop > 0
    short = summarize_timeline([(1.0, 10.0), (2.0, 10.0), (3.0, 5.0), (4.0, 5.0)], 4.0)
    assert short.window_s == 1.0 and short.drop == pytest.approx(0.5)


def test_model_inside_cache_is_called_out() -> None:
    spec = _spec(tied=False)
    roof = DeviceRoofline("cpu", "x", bandwidth={"read": Figure(10.0, "m")})
    ex = explain(spec, BenchTest(0, 8), roof, "f16", None, {"decode_tps": 1.0}, 32 << 20)
    assert "last-level cache" in ex.verdict[0]
    big = explain(spec, BenchTest(0, 8), roof, "f16", None, {"decode_tps": 1.0}, 1024)
    assert not any("last-level cache" in v for v in big.verdict)


def test_prompt_flops_amortise_the_head() -> None:
    spec = _spec(tied=False)
    head = 256 * 64
    assert spec.head_params() == head
    body = spec.active_params() - head
    # decode: every token goes through the head; a 64-token prompt: only the last one
    assert spec.flops_per_token(0) == 2 * (body + head)
    assert spec.flops_per_token(0, logits_share=1 / 64) == pytest.approx(2 * (body + head / 64))
    roof = DeviceRoofline("cpu", "x", bandwidth={"read": Figure(1.0, "m")},
                          compute={"fp32": Figure(1.0, "m")})
    ex = explain(spec, BenchTest(64, 0), roof, "f16", None, {"prefill_tps": 1.0})
    attention = 4 * 1 * 4 * 16 * 32  # layers x heads x head_dim x mid-prompt context 32
    assert ex.flops_per_prompt_token == pytest.approx(2 * (body + head / 64) + attention)


def test_each_phase_is_bound_by_its_lower_roof_and_quantised_weights_use_int8() -> None:
    """A Q4_K_M Llama-1B: its prompt roof is the int8 peak (llama.cpp's integer dots), not
    fp32 matmul; every test's bound names the lower of its two roofs, and the ceiling is
    that roof (a tg16 was once 'compute' with the memory ceiling as ceiling_ts)."""
    from strata.models.synthetic import parse_ref

    spec = parse_ref("synthetic:llama-3.2-1b@q4_k_m").gguf_spec()  # metadata: nothing written
    roof = DeviceRoofline("cpu", "x", bandwidth={"triad": Figure(30.0, "m")},
                          compute={"fp32": Figure(100.0, "m"), "int8": Figure(1000.0, "m")})
    for test in (BenchTest(0, 16), BenchTest(0, 128), BenchTest(512, 0),
                 BenchTest(512, 0, depth=4096), BenchTest(8, 0)):
        ex = explain(spec, test, roof, "f16", None, {})
        assert ex.compute_dtype == "int8"
        per_pass = max(1, min(test.n_prompt, 512))
        if test.kind == "pp":
            memory = 30e9 * per_pass / ex.bytes_per_token
            compute = 1000e9 / ex.flops_per_prompt_token
            ceiling = ex.prefill_ceiling_tps
        else:
            memory = 30e9 / ex.bytes_per_token
            compute = 1000e9 / ex.flops_per_decode_token
            ceiling = ex.decode_ceiling_tps
        assert ceiling == pytest.approx(min(memory, compute)), test
        assert ex.bound == ("memory" if memory < compute else "compute"), test
    tg = explain(spec, BenchTest(0, 128), roof, "f16", None, {})
    pp = explain(spec, BenchTest(512, 0), roof, "f16", None, {})
    assert tg.bound == "memory" and pp.bound == "compute"
    assert pp.prefill_ceiling_tps > 3 * tg.decode_ceiling_tps  # prompt faster than decode


def test_small_eta_keeps_two_significant_figures() -> None:
    """η 0.004 is not "0.00", and a note never says "η below about 0.00"."""
    from strata.bench.explain import _busy_low, eta_text

    assert [eta_text(x) for x in (0.004123, 0.0456, 0.1, 0.87, 1.234)] == \
        ["0.0041", "0.046", "0.10", "0.87", "1.23"]
    note = _busy_low("decode", 0.0011, "the host was busy", 0.5)
    assert "η 0.0011 <" in note and "below about 0.0022" in note and "0.00:" not in note
