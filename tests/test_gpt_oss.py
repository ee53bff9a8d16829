"""gpt-oss on strata's own engine, against real llama.cpp (llm_build_openai_moe_iswa).

tiny-gpt-oss (strata's test preset, written by the synthetic writer from the architecture's
declaration) holds every part the architecture adds: biases on q/k/v, the output projection,
the router and each expert's three matrices; one learned sink logit per query head; the
clamped SwiGLU; routing weights softmaxed over the chosen experts; layers 0 and 2 attending
to the last 16 positions only; YaRN RoPE (factor 8 over 256 positions, so the ramp's three
regimes are all present). At @f32 every matrix is float32; at @q8_0 the experts are MXFP4
(as every published gpt-oss GGUF stores them) and the rest q8_0.

Bounds as tests/test_archs.py: float32 logits within 1e-4 of the logit scale (measured
~3e-7 on both ops); quantised files by KL ≤ 1e-6 (the lab quantises activations to q8_0 for
the MXFP4 and q8_0 matrices as llama.cpp does; the torch ops multiply float32 activations by
the dequantised weights, measured KL 1e-7). Each variant is shown to matter: the same test
with the sinks silenced, the window ignored or YaRN dropped is off by far more than the
bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) not installed")

from strata.engine import load
from strata.models.source import resolve
from strata.ring.runtime.local import LocalRing
from tests.conftest import local_ring, ring_drive, seeded_home
from tests.test_archs import IDS, KL_BOUND, engine_logits, max_kl, rel_err
from tests.test_gguf_torch import lab_greedy, llama_cpp_greedy, llama_cpp_logits

PRESET = "tiny-gpt-oss"
WINDOW = 16
BOUND = 1e-4


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from seeded_home(tmp_path_factory, "gpt-oss-home")


@pytest.fixture(scope="module")
def files(home: Path) -> dict[str, Path]:
    return {q: resolve(f"synthetic:{PRESET}@{q}").path("gguf", "llamacpp")
            for q in ("f32", "q8_0")}


@pytest.fixture(scope="module")
def reference(files: dict[str, Path]) -> dict[str, np.ndarray]:
    return {q: llama_cpp_logits(path, IDS) for q, path in files.items()}


def test_the_files_hold_what_gpt_oss_holds(files: dict[str, Path]) -> None:
    from strata.models.gguf import read_spec

    spec = read_spec(files["q8_0"])
    kinds = {t.name: t.dtype for t in spec.tensors}
    assert kinds["blk.0.ffn_gate_exps.weight"] == "MXFP4"
    assert kinds["blk.0.attn_q.weight"] == "Q8_0"
    assert kinds["blk.1.ffn_down_exps.bias"] == "F32"
    assert spec.tensor("blk.2.attn_sinks.weight").shape == (4,)
    assert spec.windowed_layers() == 2  # layers 0 and 2
    assert read_spec(files["f32"]).tensor("blk.0.ffn_up_exps.weight").dtype == "F32"


@pytest.mark.parametrize("ops", ["lab", "torch"])
def test_float32_logits_equal_llama_cpps(files: dict[str, Path], reference: dict[str, Any],
                                         ops: str) -> None:
    want = reference["f32"]
    got = engine_logits(files["f32"], ops, IDS)
    err, kl = float(rel_err(got, want).max()), max_kl(want, got)
    print(f"\n{PRESET} {ops}: max |strata - llama.cpp| / scale = {err:.1e}, max KL {kl:.1e}")
    assert err <= BOUND and kl <= KL_BOUND


@pytest.mark.parametrize("ops", ["lab", "torch"])
def test_mxfp4_experts_follow_llama_cpp(files: dict[str, Path], reference: dict[str, Any],
                                        ops: str) -> None:
    kl = max_kl(reference["q8_0"], engine_logits(files["q8_0"], ops, IDS))
    print(f"\n{PRESET}@q8_0 (MXFP4 experts) {ops}: max KL(llama.cpp || strata) {kl:.1e}")
    assert kl <= KL_BOUND


def test_the_lab_runs_gpt_oss_on_its_own_kernels(files: dict[str, Path]) -> None:
    import strata.lab

    model = strata.lab.load(files["q8_0"], "cpu", n_ctx=64)
    assert {"linear_mxfp4", "linear_q8_0", "attention_sinks", "swiglu_oai"} <= \
        set(model.kernels.choices)
    assert "attention_cached" not in model.kernels.choices


def _logits_with(path: Path, ops: str, edit: Any) -> np.ndarray:
    ex = load(path, ops=ops)
    edit(ex)
    ex.reset(len(IDS))
    with torch.inference_mode():
        out = ex.forward(torch.tensor(IDS), 0)
    assert out is not None
    return out.numpy()


def _silence_sinks(ex: Any) -> None:
    for name, held in ex.held.items():
        if name.endswith("attn_sinks.weight"):
            held.fill_(-1e30)  # exp(sink) = 0: plain attention


def _no_yarn(ex: Any) -> None:
    ex.weights.config["rope_scaling"] = None


@pytest.mark.parametrize("ops", ["lab", "torch"])
def test_each_gpt_oss_variant_moves_the_logits_past_the_bound(
        files: dict[str, Path], reference: dict[str, Any], ops: str) -> None:
    """The comparison above would fail if the engine skipped a variant: silencing the
    sinks or dropping YaRN moves every position far past the bound; ignoring the window
    leaves the positions inside it alone and breaks every later one."""
    want, path = reference["f32"], files["f32"]
    for label, edit in (("sinks silenced", _silence_sinks), ("no YaRN", _no_yarn)):
        err = rel_err(_logits_with(path, ops, edit), want)
        print(f"\n{ops}, {label}: min error / scale {err.min():.1e}")
        assert err.min() > 10 * BOUND
    err = rel_err(engine_logits(path, ops, IDS, window=1 << 20), want)
    print(f"\n{ops}, window ignored: before it {err[:WINDOW].max():.1e}, "
          f"after it min {err[WINDOW:].min():.1e}")
    assert err[:WINDOW].max() <= BOUND and err[WINDOW:].min() > 10 * BOUND


def test_greedy_tokens_equal_llama_cpps_for_32_steps(files: dict[str, Path]) -> None:
    for q in ("f32", "q8_0"):
        want, want_logits = llama_cpp_greedy(files[q], IDS[:4], 32)
        got, got_logits = lab_greedy(files[q], IDS[:4], 32)
        assert got == want, q
        if q == "f32":
            scale = float(np.abs(want_logits).max())
            np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=BOUND * scale)


def test_quality_on_the_lab_equals_llama_cpps_perplexity(home: Path) -> None:
    import json

    from tests.conftest import run_cli

    ppl = {}
    for backend in ("lab", "llamacpp"):
        r = run_cli("quality", f"synthetic:{PRESET}@q8_0", "-B", backend, "--ctx", "64",
                    "--max-chunks", "3", "--json", home=home)
        assert r.returncode == 0, r.stderr
        ppl[backend] = json.loads(r.stdout)[0]["ppl"]
    print(f"\n{PRESET}@q8_0 perplexity: lab {ppl['lab']:.4f}, llama.cpp {ppl['llamacpp']:.4f}")
    assert ppl["lab"] == pytest.approx(ppl["llamacpp"], rel=1e-3)


@pytest.mark.parametrize(("preset", "total", "active_b", "experts_n"),
                         [("gpt-oss-20b", 20.91, 3.61, 32), ("gpt-oss-120b", 116.83, 5.13, 128)])
def test_gpt_oss_presets_have_their_cards_sizes(preset: str, total: float, active_b: float,
                                                experts_n: int) -> None:
    """OpenAI's gpt-oss model card: 20.91B parameters, 3.61B active per token for the 20b,
    116.83B and 5.13B for the 120b (the unembedding counted, the embedding lookup not)."""
    from strata.models.synthetic import parse_ref

    spec = parse_ref(f"synthetic:{preset}@q8_0").gguf_spec()  # the plan: nothing written
    assert spec.params() / 1e9 == pytest.approx(total, abs=0.01)
    experts = sum(t.elements for t in spec.tensors if "_exps." in t.name)
    embd = spec.tensor("token_embd.weight").elements
    active = spec.params() - embd - experts + experts * 4 // experts_n
    assert active / 1e9 == pytest.approx(active_b, abs=0.01)
    mxfp4 = {t.dtype for t in spec.tensors if t.name.endswith("_exps.weight")}
    assert mxfp4 == {"MXFP4"}


def test_hf_folder_holds_the_gguf_s_parameters_with_fused_experts() -> None:
    """The synthetic Hugging Face folder stores what the GGUF stores, in transformers'
    GptOss layout: gate and up fused into [E, hidden, 2·ffn], down as [E, ffn, hidden],
    each with its [E, N] bias, the router as mlp.router; strata reads it back with the
    same parameter and expert counts (the experts found under their fused names)."""
    from strata.models.hf import read_safetensors_header, spec_from_dir

    gguf = resolve(f"synthetic:{PRESET}@f32").spec
    folder = resolve(f"synthetic:{PRESET}@f32").path("hf", "torch")
    hf = spec_from_dir(folder)
    assert hf.params() == gguf.params()
    assert hf.expert_params() == gguf.expert_params() > 0
    assert (hf.n_experts, hf.n_experts_used, hf.expert_ffn) == \
        (gguf.n_experts, gguf.n_experts_used, gguf.expert_ffn)
    import json
    import struct

    raw = (folder / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    e, f, h = gguf.n_experts, gguf.expert_ffn, gguf.hidden
    shapes = {k.removeprefix("model.layers.0."): v["shape"] for k, v in header.items()
              if k.startswith("model.layers.0.")}
    assert shapes["mlp.experts.gate_up_proj"] == [e, h, 2 * f]
    assert shapes["mlp.experts.gate_up_proj_bias"] == [e, 2 * f]
    assert shapes["mlp.experts.down_proj"] == [e, f, h]
    assert shapes["mlp.router.bias"] == [e] and shapes["self_attn.sinks"] == [gguf.n_heads]
    assert len(read_safetensors_header(folder / "model.safetensors")) == len(header) - 1


@pytest.fixture(scope="module")
def ring() -> Iterator[LocalRing]:
    yield from local_ring(3)


@pytest.mark.parametrize(("quant", "world", "ops"), [("f32", 2, "lab"), ("f32", 3, "torch"),
                                                     ("q8_0", 2, "lab")])
def test_ring_matches_llama_cpp(ring: LocalRing, files: dict[str, Path], quant: str,
                                world: int, ops: str) -> None:
    """Prompt logits and 24 greedy steps (past the window) over 2 or 3 stages."""
    path, prompt, steps = files[quant], IDS[:8], 24
    want, want_logits = llama_cpp_greedy(path, prompt, steps + 1)
    res = ring_drive(ring, path, world, prompt, steps + 1, ops)
    assert res["tokens"] == want
    if quant == "f32":
        err = float(np.abs(np.stack(res["step_logits"]) - want_logits).max())
        assert err <= BOUND * float(np.abs(want_logits).max())


@pytest.mark.parametrize("ctx", [40, 1000])
def test_fit_sizes_the_kv_cache_as_llama_cpp_allocates_it(home: Path, files: dict[str, Path],
                                                          ctx: int) -> None:
    """llama.cpp's own log of the file (tests/test_fit_windows.py reads it): one global
    layer's cells and two windowed layers' cells, f16 K and V of 2 heads of 32."""
    import json

    from tests.conftest import run_cli
    from tests.test_fit_windows import llama_cpp_kv

    cells, mib = llama_cpp_kv(files["q8_0"], ctx, False)
    r = run_cli("fit", f"synthetic:{PRESET}@q8_0", "--ctx", str(ctx), "--json", home=home)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["devices"][0]["kv_bytes"]
    assert got == 2 * 2 * 32 * 2 * (cells["non-SWA"] + 2 * cells["SWA"])
    assert got / 2**20 == pytest.approx(mib, abs=0.01)


def test_a_decode_step_binds_every_expert_and_runs_the_chosen(files: dict[str, Path]) -> None:
    """-B lab decodes gpt-oss through the bound step (lab/decode_moe.py), not the forward
    pass: each layer holds every expert's bound calls; its logits equal the forward pass's."""
    import strata.lab

    model = strata.lab.load(files["q8_0"], "cpu", n_ctx=64)
    with torch.inference_mode():
        model.prefill(IDS[:4])
        got = model.decode(IDS[4])
        step = model._step
        model.reset(64)
        want = model.prefill(IDS[:5])
    assert step is not None
    assert all(layer.moe is not None and len(layer.moe.experts) == 4 for layer in step.layers)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0,
                               atol=1e-5 * float(want.abs().max()))
