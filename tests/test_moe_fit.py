"""Mixture of experts in `strata fit`, bench's explanation and the lab backend.

Every figure here is computed by hand from the published shapes (the arithmetic is written
out), not by strata's own code: memory holds every expert, a decoded token reads the shared
weights + n_used experts per layer, llama.cpp's expert offload (-ngl 99 -ot exps=CPU) puts
the shared weights and KV on the GPU and the experts in RAM, and its decode time is the sum
of the two sides' reads. The GPU host is a recorded-style probe of a machine that is not
here (tests/fixtures/fit/rtx4090_24gb.json) with a stated roofline; the bytes per token are
checked against a real llama.cpp bench of the tiny MoE.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from strata.bench.explain import explain
from strata.bench.scenario import BenchTest
from strata.fit import NO, PARTIAL, EtaHistory, FitOptions, fit_model
from strata.fit.memory import Shape, llamacpp_reserved, whole
from strata.fit.weights import requantised
from strata.hardware.profile import HostProfile
from strata.measure.roofline import DeviceRoofline, Figure, Roofline
from strata.models.source import resolve
from strata.models.synthetic import parse_ref
from strata.report.fit_table import _offload_lines
from strata.views.fit import note_lines, prediction_lines
from tests.conftest import FIXTURES, run_cli
from tests.seed_host import seed_host

GiB = 2**30


def q8(n: int) -> int:
    return n // 32 * 34  # q8_0: 34 bytes per block of 32 values


def f16(n: int) -> int:
    return 2 * n


def f32(n: int) -> int:
    return 4 * n


# -- the tiny MoE (hidden 64, 2 layers, 4 heads / 2 KV heads of 16, vocab 512, 8 experts of
#    width 64, 2 per token, untied head), at f16: matrices F16, norms and router F32 ---------

TINY_SHARED_LAYER = (f32(64)  # attn_norm
                     + f16(64 * 64) + f16(32 * 64) + f16(32 * 64)  # attn_q, attn_k, attn_v
                     + f32(16) + f32(16)  # attn_q_norm, attn_k_norm
                     + f16(64 * 64)  # attn_output
                     + f32(64)  # ffn_norm
                     + f32(8 * 64))  # ffn_gate_inp, the router (8 experts x 64)
TINY_ONE_EXPERT = 3 * f16(64 * 64)  # gate, up, down of one expert in one layer
TINY_EMBD = f16(512 * 64)
TINY_HEAD = f16(512 * 64) + f32(64)  # output + output_norm


def test_tiny_moe_hand_figures() -> None:
    """The arithmetic, as plain numbers."""
    assert TINY_SHARED_LAYER == 27264 and TINY_ONE_EXPERT == 24576
    total = TINY_EMBD + TINY_HEAD + 2 * (TINY_SHARED_LAYER + 8 * TINY_ONE_EXPERT)
    assert total == 579072
    per_token = 128 + TINY_HEAD + 2 * TINY_SHARED_LAYER + 2 * 2 * TINY_ONE_EXPERT
    assert per_token == 218752  # one embedding row (64 x 2 B) + head + shared + 2x2 experts


def test_fit_memory_holds_every_expert() -> None:
    """The CPU row's weights are the whole file: all 8 experts of both layers."""
    report = fit_model(resolve("synthetic:tiny-moe@f16"), _host(), FitOptions(ctx=512))
    cpu = report.row("cpu").placement.device
    assert cpu.weights == TINY_EMBD + TINY_HEAD + 2 * (TINY_SHARED_LAYER + 8 * TINY_ONE_EXPERT)
    assert cpu.kv == 2 * 2 * 2 * 16 * 512 * 2  # K and V x layers x kv heads x dim x ctx x f16
    assert any("8 experts per layer, 2 per token" in n for n in report.notes)


def test_requantised_estimate_keeps_the_router_f32() -> None:
    """llama-quantize never quantises ffn_gate_inp: the q8_0 estimate of an f16 MoE keeps it
    F32, and then equals the exact q8_0 plan, byte for byte."""
    spec = resolve("synthetic:tiny-moe@f16").spec
    est = requantised(spec, "q8_0")
    router = est.tensor("blk.0.ffn_gate_inp.weight")
    assert router.dtype == "F32" and router.nbytes == f32(8 * 64)
    assert est.tensor("blk.0.ffn_up_exps.weight").dtype == "Q8_0"
    shared = (f32(64) + q8(64 * 64) + 2 * q8(32 * 64) + 2 * f32(16) + q8(64 * 64) + f32(64)
              + f32(8 * 64))
    hand = 2 * q8(512 * 64) + f32(64) + 2 * (shared + 8 * 3 * q8(64 * 64))
    assert hand == 310272
    assert est.weight_bytes() == hand == parse_ref("synthetic:tiny-moe@q8_0").gguf_spec() \
        .weight_bytes()


def test_compute_buffer_uses_the_experts_width() -> None:
    """llama.cpp's MoE graph holds, per token and in f32: router logits and probabilities
    (n_experts each), gate and up of every expert used (2 x n_used x expert_ffn) and their
    down outputs before the weighted sum (n_used x hidden). Mixtral: 2 of 8 experts of 14336
    — twice the dense 2 x ffn a dense rule would count."""
    spec = resolve("synthetic:mixtral-8x7b@q4_0").spec
    shape = Shape(ctx=4096)
    moe = 4 * (2 * 8 + 2 * 2 * 14336 + 2 * 4096)
    dense = 4 * 2 * 14336
    as_dense = replace(spec, n_experts=0, n_experts_used=0, expert_ffn=0)
    gained = llamacpp_reserved(spec, shape, whole(spec)) - \
        llamacpp_reserved(as_dense, shape, whole(as_dense))
    assert gained == 512 * (moe - dense) == 512 * 147_520


# -- expert offload on a recorded RTX 4090 host -----------------------------------------------

GPU_GBS, CPU_GBS = 900.0, 60.0  # the stated roofline: 4090 STREAM copy, dual-channel DDR5


def _host(name: str = "rtx4090_24gb") -> HostProfile:
    return HostProfile.from_dict(json.loads((FIXTURES / "fit" / f"{name}.json").read_text()))


def _roofline() -> Roofline:
    return Roofline([DeviceRoofline("cpu", "Ryzen 9 7950X",
                                    bandwidth={"triad": Figure(CPU_GBS, "stated")}),
                     DeviceRoofline("cuda:0", "NVIDIA GeForce RTX 4090",
                                    bandwidth={"copy": Figure(GPU_GBS, "stated")})], seconds=1)


def test_expert_offload_when_the_moe_does_not_fit_the_gpu_whole() -> None:
    """Qwen3-30B-A3B at q8_0 (30 GiB) on a 24 GB RTX 4090: -ngl splits it, but attention,
    norms, routers and head (1.25 GiB) + KV fit the GPU, so fit advises expert offload and
    predicts its decode: t = (shared + KV) / GPU bandwidth + active experts / CPU bandwidth."""
    report = fit_model(resolve("synthetic:qwen3-30b-a3b@q8_0"), _host(), FitOptions(ctx=8192),
                       _roofline(), EtaHistory("llamacpp"))
    gpu = report.row("cuda:0")
    assert gpu.verdict == PARTIAL
    eo = gpu.expert_offload
    assert eo is not None and eo.fits
    # by hand, per layer: q (4096x2048) + k, v (512x2048) + o (2048x4096) at q8_0, the four
    # norms (2048, 2048, 128, 128) and the router (128x2048) at f32
    shared_layer = q8(4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096) + f32(2048 + 2048 + 256) \
        + f32(128 * 2048)
    assert shared_layer == 21_120_000
    head = q8(151936 * 2048) + f32(2048)  # output + output_norm
    assert eo.device.weights == 48 * shared_layer + head == 1_344_380_928
    assert eo.device.kv == 2 * 48 * 4 * 128 * 8192 * 2  # every layer's KV on the GPU
    one_expert = q8(3 * 768 * 2048)  # gate, up, down of one expert in one layer
    embd = q8(151936 * 2048)
    assert eo.host.weights == 48 * 128 * one_expert + embd  # all experts stay in RAM
    # decode tg128 (KV at its mid context, 64): the GPU reads shared + one embedding row + KV,
    # the CPU reads 8 experts x 48 layers
    gpu_bytes = 48 * shared_layer + head + q8(2048) + 2 * 48 * 4 * 128 * 64 * 2
    cpu_bytes = 8 * 48 * one_expert
    assert (gpu_bytes, cpu_bytes) == (1_350_674_560, 1_925_185_536)
    seconds = gpu_bytes / (GPU_GBS * 1e9) + cpu_bytes / (CPU_GBS * 1e9)
    assert seconds == pytest.approx(0.0335872, rel=1e-5)
    tg = next(p for p in eo.predictions if p.test == "tg128")
    assert tg.ceiling_tps == pytest.approx(1 / seconds, rel=1e-9)  # 29.77 t/s
    assert tg.tps == pytest.approx(0.7 / seconds, rel=1e-9)  # x the prior η (no history)
    text = "\n".join(t.plain for t in [*note_lines(report), *prediction_lines(report)])
    assert ("cuda:0: attention and shared weights on the GPU, experts on the CPU: pass "
            "-ngl 99 -ot exps=CPU") in text
    assert "with experts on the CPU (-ngl 99 -ot exps=CPU" in text and "29.8 t/s" in text
    row = next(r for r in report.to_json()["devices"] if r["device"] == "cuda:0")
    assert row["expert_offload"] == "-ngl 99 -ot exps=CPU" and row["expert_offload_fits"]
    assert row["expert_offload_predicted_decode_ts"] == pytest.approx(0.7 / seconds)
    (line,) = _offload_lines(report.to_dict())  # the HTML report's note
    assert line.startswith("cuda:0: experts on the CPU (-ngl 99 -ot exps=CPU) fits") \
        and "tg128 ≈ 20.8 t/s" in line


def test_expert_offload_is_said_not_to_fit_when_ram_cannot_hold_the_experts() -> None:
    """Mixtral-8x7B at f16 (87 GiB of experts) cannot keep its experts in 48 GiB of RAM; a
    dense model that does not fit gets no expert advice at all."""
    report = fit_model(resolve("synthetic:mixtral-8x7b@f16"), _host(), FitOptions(ctx=4096))
    gpu = report.row("cuda:0")
    assert gpu.verdict == NO and gpu.expert_offload is not None
    assert not gpu.expert_offload.fits and "RAM" in gpu.expert_offload.reason
    assert any("does not fit either" in t.plain for t in note_lines(report))
    dense = fit_model(resolve("synthetic:llama-3.1-8b@f32"), _host(), FitOptions(ctx=8192))
    assert dense.row("cuda:0").verdict == PARTIAL
    assert dense.row("cuda:0").expert_offload is None


# -- bench: bytes per token against real llama.cpp -------------------------------------------


def test_explain_names_the_active_experts() -> None:
    spec = resolve("synthetic:tiny-moe@f16").spec
    roof = DeviceRoofline("cpu", "x", bandwidth={"triad": Figure(10.0, "m")})
    ex = explain(spec, BenchTest(0, 32), roof, "f16", None, {"decode_tps": 1.0})
    assert "active experts 2 of 8 per layer" in ex.basis[0]
    assert any("active experts 2 of 8" in v for v in ex.verdict)


def test_llamacpp_bench_of_the_tiny_moe_stores_the_hand_bytes_per_token(tmp_path: Path) -> None:
    """Real llama.cpp decodes tiny-moe@f16 (tg32); the stored bytes per token are the shared
    weights (one embedding row, head, attention, norms, routers) + 2 of 8 experts in each of
    the 2 layers + the KV cache at the decode's mid context (16 tokens)."""
    pytest.importorskip("llama_cpp")
    seed_host(tmp_path)
    proc = run_cli("bench", "synthetic:tiny-moe@f16", "-B", "llamacpp", "-p", "none", "-n",
                   "32", "-r", "1", "-o", "json", home=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (record,) = json.loads(proc.stdout)
    weights = 128 + TINY_HEAD + 2 * TINY_SHARED_LAYER + 2 * 2 * TINY_ONE_EXPERT
    kv = 2 * 2 * 2 * 16 * 16 * 2  # K and V x layers x kv heads x head dim x 16 tokens x f16
    assert record["bytes_per_token"] == weights + kv == 222848
    assert record["decode_ts"] > 0
    assert any("active experts 2 of 8" in n for n in record["notes"])


# -- the lab backend plans MoE like the others ----------------------------------------------


def test_lab_plans_a_moe_model(strata_home: Path) -> None:
    """-B lab runs routed experts (tests/test_archs.py checks its logits against
    llama.cpp's); fit plans it with every expert held, as stored."""
    proc = run_cli("fit", "synthetic:tiny-moe@f16", "-B", "lab", "--json", home=strata_home)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["devices"][0]["weights_bytes"] == parse_ref("synthetic:tiny-moe@f16") \
        .gguf_spec().weight_bytes()
