"""Architectures beyond llama/qwen2 on strata's own engine, against real llama.cpp.

Each architecture is one declaration (strata.models.arch); these tests run its test preset
(written by strata's synthetic writer, loaded by llama.cpp as it is) on every executor —
the lab's ops, the torch ops, and 2- and 3-stage rings of loopback worker processes — and
compare with llama.cpp's logits and greedy tokens on the same GGUF (f32 K/V cache). The
reference shares no code with strata: llama.cpp reads the file and runs its own graph
(llm_build_qwen3, llm_build_gemma3, llm_build_llama with rope_freqs).

    tiny-qwen3   per-head q/k RMS norms, NeoX RoPE, no biases
    tiny-llama3  Llama 3.2's RoPE frequency factors (rope_freqs.weight) in all three regimes
    tiny-gemma3  √hidden embedding scale, q/k norms, post-attention and post-MLP norms,
                 tanh-GELU gated MLP, tied head; layers 0-4 and 6 see the last 16 positions
                 only (RoPE base 10 000), layer 5 everything (the file's base)
    tiny-phi3    fused q/k/v and gate/up matrices, LongRoPE (short factors up to a 4096
                 context, long ones past it, cos/sin scaled by the attention factor)

Bounds: float32 files, logits within 1e-4 of the logit scale (both sides float32, sums in
another order: measured ~3e-7) — except gemma3: llama.cpp's CPU GELU rounds its input and
its result to fp16 (the gelu_mul op's docstring), so a 1e-7 difference upstream that lands
on an fp16 rounding boundary moves one activation by 2⁻¹¹ relative; over a 48-position
prompt that happens a few times (measured up to 2e-4 of the scale on both executors, KL
< 1e-9). The gemma3 bound is 5e-4 of the scale plus KL ≤ 1e-6; the window test below shows
it still separates: ignoring the window moves logits far beyond it.
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
from tests.test_gguf_torch import (
    lab_greedy,
    llama_cpp_greedy,
    llama_cpp_logits,
    quiet_stderr,
)

PRESETS = ("tiny-qwen3", "tiny-llama3", "tiny-gemma3", "tiny-phi3")
MOE = ("tiny-moe", "tiny-mixtral")  # qwen3moe and Mixtral (llama with experts) on the lab
IDS = [1, 37, 290, 5, 77, 411, 98, 12, 300, 64, 129, 7, 255, 18, 333, 90] * 3  # 48 > 16
BOUND = {"tiny-gemma3": 5e-4}  # see the module docstring; the others 1e-4
KL_BOUND = 1e-6
WINDOW = 16  # tiny-gemma3's sliding window


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from seeded_home(tmp_path_factory, "archs-home")


@pytest.fixture(scope="module")
def files(home: Path) -> dict[str, Path]:
    out = {p: resolve(f"synthetic:{p}@f32").path("gguf", "llamacpp") for p in PRESETS}
    out.update({f"{p}@q8_0": resolve(f"synthetic:{p}@q8_0").path("gguf", "llamacpp")
                for p in PRESETS + MOE})
    out.update({p: resolve(f"synthetic:{p}@f32").path("gguf", "llamacpp") for p in MOE})
    return out


@pytest.fixture(scope="module")
def reference(files: dict[str, Path]) -> dict[str, np.ndarray]:
    return {name: llama_cpp_logits(path, IDS) for name, path in files.items()}


def engine_logits(path: Path, ops: str, ids: list[int], window: int | None = None,
                  kv: str = "f32") -> np.ndarray:
    ex = load(path, ops=ops, kv=kv)
    if window is not None:  # what the file says, overridden (the window test)
        ex.weights.spec.sliding_window = window
    ex.reset(len(ids))
    with torch.inference_mode():
        out = ex.forward(torch.tensor(ids), 0)
    assert out is not None
    return out.numpy()


def rel_err(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per position: max |got - want| over the vocabulary / max |want| (the logit scale)."""
    return np.abs(got - want).max(-1) / np.abs(want).max()


def max_kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    p = torch.log_softmax(torch.from_numpy(p_logits).double(), -1)
    q = torch.log_softmax(torch.from_numpy(q_logits).double(), -1)
    return float((p.exp() * (p - q)).sum(-1).max())


@pytest.mark.parametrize("ops", ["lab", "torch"])
@pytest.mark.parametrize("preset", PRESETS)
def test_float32_logits_equal_llama_cpps(files: dict[str, Path], reference: dict[str, Any],
                                         preset: str, ops: str) -> None:
    want = reference[preset]
    got = engine_logits(files[preset], ops, IDS)
    err, kl = float(rel_err(got, want).max()), max_kl(want, got)
    print(f"\n{preset} {ops}: max |strata - llama.cpp| / scale = {err:.1e}, max KL {kl:.1e}")
    assert err <= BOUND.get(preset, 1e-4)
    assert kl <= KL_BOUND


@pytest.mark.parametrize("preset", PRESETS)
def test_a_float16_cache_holds_k_and_v_as_llama_cpps_does(files: dict[str, Path],
                                                          preset: str) -> None:
    """-ctk/-ctv f16 (llama.cpp's default, and -B lab's): the lab over a float16 cache equals
    the torch ops over one (the same rounded K/V, another attention), and is nearer llama.cpp's
    f16-cache logits than the float32 cache is — a cache that kept float32 values, or rounded
    them otherwise, would not be. (llama.cpp also rounds q and the softmax weights to f16 in
    its f16-cache products; strata keeps those in float32, so the two do not coincide.)"""
    path = files[preset]
    lab16, lab32 = engine_logits(path, "lab", IDS, kv="f16"), engine_logits(path, "lab", IDS)
    torch16 = engine_logits(path, "torch", IDS, kv="f16")
    llama16 = llama_cpp_logits(path, IDS, kv_type=1)
    twin, near = (float(rel_err(lab16, w).max()) for w in (torch16, llama16))
    far = float(rel_err(lab32, llama16).max())
    print(f"\n{preset} f16 cache: lab vs torch {twin:.1e}, vs llama.cpp f16 {near:.1e} "
          f"(the f32 cache: {far:.1e})")
    assert twin <= BOUND.get(preset, 1e-4)
    assert max_kl(llama16, lab16) <= KL_BOUND
    assert near < far


# heads of whole q8_0 blocks (32, 32 and 64 values): attention_sinks_q8_0 on windowed and
# full layers, attention_window_q8_0 and attention_cached_q8_0
Q8_CACHE = ("tiny-gpt-oss", "tiny-gemma3", "tiny-k")


@pytest.mark.parametrize("preset", Q8_CACHE)
def test_a_q8_0_cache_holds_k_and_v_as_llama_cpps_does(home: Path, preset: str) -> None:
    """-ctk/-ctv q8_0: the lab over a q8_0 cache equals the torch ops over one (the same
    blocks, dequantised by torch, another attention) and stays within llama.cpp's q8_0-cache
    distribution (KL); its logits are far from the f16 cache's (the rows really hold blocks).
    Where strata's K rows are llama.cpp's (NeoX RoPE: gpt-oss) the two q8_0 caches hold the
    same blocks, so the lab is many times nearer llama.cpp's q8_0 logits than the f16 cache
    is. (Llama-family K rows are not: strata un-permutes q/k to rotate half-split pairs, so a
    block groups other dimensions than llama.cpp's; gemma3's fp16-rounded GELU moves values
    across quantisation steps.) A cache quantised otherwise fails the first or last check."""
    path = resolve(f"synthetic:{preset}@f32").path("gguf", "llamacpp")
    lab8 = engine_logits(path, "lab", IDS, kv="q8_0")
    lab16 = engine_logits(path, "lab", IDS, kv="f16")
    torch8 = engine_logits(path, "torch", IDS, kv="q8_0")
    llama8 = llama_cpp_logits(path, IDS, kv_type=8)
    twin, near, f16 = (float(rel_err(lab8, w).max()) for w in (torch8, llama8, lab16))
    far = float(rel_err(lab16, llama8).max())
    print(f"\n{preset} q8_0 cache: lab vs torch {twin:.1e}, vs llama.cpp q8_0 {near:.1e} "
          f"(the f16 cache: {far:.1e}), KL {max_kl(llama8, lab8):.1e}")
    assert twin <= 2 * BOUND.get(preset, 1e-4)  # gemma3: steps crossed by its GELU's rounding
    assert max_kl(llama8, lab8) <= 1e-5
    assert f16 > 5 * twin
    if preset == "tiny-gpt-oss":
        assert near < far / 5


@pytest.mark.parametrize("preset", PRESETS)
def test_q8_0_logits_follow_ggml_numerics_on_the_lab(files: dict[str, Path],
                                                     reference: dict[str, Any],
                                                     preset: str) -> None:
    want = reference[f"{preset}@q8_0"]
    kl = max_kl(want, engine_logits(files[f"{preset}@q8_0"], "lab", IDS))
    print(f"\n{preset}@q8_0 lab: max KL(llama.cpp || lab) {kl:.1e}")
    assert kl <= KL_BOUND


@pytest.mark.parametrize("preset", PRESETS)
def test_backend_torch_runs_each_architecture_like_llama_cpp(files: dict[str, Path],
                                                            reference: dict[str, Any],
                                                            preset: str) -> None:
    """`-B torch`: transformers' own class for the architecture, built from the GGUF by
    strata's loader (Gemma's norms take back the 1 the converter added). transformers'
    Gemma evaluates GELU unrounded: 2⁻¹¹ relative per activation off llama.cpp's fp16
    table, measured 4.6e-4 of the logit scale here — bounded at 1e-3, KL ≤ 1e-6."""
    from strata.backends.base import LoadConfig
    from strata.backends.torch_backend import TorchBackend

    backend = TorchBackend()
    backend.load(resolve(str(files[preset])), LoadConfig(device="cpu", dtype="float32"))
    try:
        got = np.asarray(backend.logits(IDS))
    finally:
        backend.close()
    want = reference[preset]
    err, kl = float(rel_err(got, want).max()), max_kl(want, got)
    print(f"\n{preset} transformers: max error / scale {err:.1e}, max KL {kl:.1e}")
    assert err <= (1e-3 if preset == "tiny-gemma3" else 1e-4)
    assert kl <= KL_BOUND


@pytest.mark.parametrize(("preset", "cls"), [("tiny-qwen3", "Qwen3ForCausalLM"),
                                             ("tiny-gemma3", "Gemma3ForCausalLM"),
                                             ("tiny-llama3", "LlamaForCausalLM"),
                                             ("tiny-phi3", "Phi3ForCausalLM"),
                                             ("tiny-gpt-oss", "GptOssForCausalLM")])
def test_hf_folders_load_in_transformers_with_every_tensor(home: Path, preset: str,
                                                           cls: str) -> None:
    """The synthetic Hugging Face folder of each preset: transformers' class, no tensor
    missing or unexpected, the window and RoPE scaling in its config."""
    import transformers

    folder = resolve(f"synthetic:{preset}@f32").path("hf", "torch")
    lm, info = transformers.AutoModelForCausalLM.from_pretrained(folder,
                                                                output_loading_info=True)
    assert type(lm).__name__ == cls
    assert not info["missing_keys"] and not info["unexpected_keys"]
    if preset == "tiny-gemma3":
        assert lm.config.sliding_window == WINDOW
        assert lm.config.layer_types[5] == "full_attention"
        assert lm.config.layer_types.count("sliding_attention") == 6
    if preset == "tiny-llama3":
        assert lm.config.rope_parameters["rope_type"] == "llama3"
    if preset == "tiny-gpt-oss":  # llama.cpp's swa_pattern 2: layer 0 windowed, layer 1 not
        assert lm.config.layer_types == ["sliding_attention", "full_attention",
                                         "sliding_attention"]
        assert lm.config.rope_parameters["rope_type"] == "yarn"
        assert lm.config.num_local_experts == 4 and lm.config.num_experts_per_tok == 2
    with torch.no_grad():
        logits = lm(torch.tensor([IDS[:8]])).logits
    assert torch.isfinite(logits).all() and logits.std() > 0


@pytest.mark.parametrize("preset", MOE)
def test_routed_experts_run_on_lab_kernels_like_llama_cpp(files: dict[str, Path],
                                                          reference: dict[str, Any],
                                                          preset: str) -> None:
    """-B lab on mixture-of-experts files: the router on the lab's linear kernel, each
    token's experts multiplied as stored (f32 and q8_0 blocks), the rest never read. The
    same bounds as dense files (the ring's MoE test shows these presets have no routing
    near-ties at these positions)."""
    import strata.lab

    model = strata.lab.load(files[preset], "cpu", n_ctx=64)
    assert {"linear_f32"} <= set(model.kernels.choices)
    want = reference[preset]
    err = float(rel_err(engine_logits(files[preset], "lab", IDS), want).max())
    kl = max_kl(reference[f"{preset}@q8_0"], engine_logits(files[f"{preset}@q8_0"], "lab", IDS))
    print(f"\n{preset} lab: f32 max error / scale {err:.1e}; q8_0 max KL {kl:.1e}")
    assert err <= 1e-4 and kl <= KL_BOUND
    want_tokens, _ = llama_cpp_greedy(files[preset], IDS[:4], 16)
    assert lab_greedy(files[preset], IDS[:4], 16)[0] == want_tokens


def test_longrope_past_the_original_context_uses_the_long_factors(
        files: dict[str, Path], reference: dict[str, Any]) -> None:
    """llama.cpp rotates Phi-3 with the long factors when its context exceeds the original
    4096 positions, whatever the prompt's length; the engine picks them by the same rule
    (its cache's capacity). The logits at a 4352-position context differ from the short
    ones' (so the choice is exercised) and match llama.cpp's there."""
    from llama_cpp import Llama

    path, ctx = files["tiny-phi3"], 4352
    with quiet_stderr():
        llm = Llama(model_path=str(path), n_ctx=ctx, n_batch=64, n_ubatch=64, logits_all=True,
                    type_k=0, type_v=0, n_threads=2, verbose=False)
        try:
            llm.eval(IDS)
            want = np.array(llm.scores[:len(IDS)], dtype=np.float32)
        finally:
            llm.close()
    assert float(rel_err(reference["tiny-phi3"], want).max()) > 10 * 1e-4  # measured 2.9e-3
    for ops in ("lab", "torch"):
        ex = load(path, ops=ops)
        ex.reset(ctx)
        with torch.inference_mode():
            got = ex.forward(torch.tensor(IDS), 0)
        assert got is not None
        err = float(rel_err(got.numpy(), want).max())
        print(f"\ntiny-phi3 {ops} at a {ctx} context (long factors): error / scale {err:.1e}")
        assert err <= 1e-4


def test_ignoring_the_window_breaks_exactly_the_positions_past_it(
        files: dict[str, Path], reference: dict[str, Any]) -> None:
    """The window test fails when the window is ignored (the local layers keep their own
    RoPE base but see every key): positions before it agree (every key is inside it), every
    later one is off by far more than the bound."""
    want = reference["tiny-gemma3"]
    for ops in ("lab", "torch"):
        err = rel_err(engine_logits(files["tiny-gemma3"], ops, IDS, window=1 << 20), want)
        print(f"\ntiny-gemma3 {ops}, window ignored: error before it "
              f"{err[:WINDOW].max():.1e}, after it min {err[WINDOW:].min():.1e}")
        assert err[:WINDOW].max() <= BOUND["tiny-gemma3"]
        assert err[WINDOW:].min() > 20 * BOUND["tiny-gemma3"]


def test_a_windowed_cache_holds_the_window_not_the_context(files: dict[str, Path]) -> None:
    """The lab's windowed layers keep window - 1 + chunk rows, however long the context;
    prefill in chunks smaller than the window moves rows to the front and still decodes the
    same logits as one forward over the whole prompt."""
    path = files["tiny-gemma3"]
    full = engine_logits(path, "lab", IDS)
    ex = load(path, ops="lab")
    ex.chunk = 5  # 48 positions through a 16 - 1 + 5 = 20-row windowed cache
    ex.reset(len(IDS))
    assert ex.cache is not None
    rows = [k.shape[1] for k in ex.cache.k]
    assert rows == [20, 20, 20, 20, 20, len(IDS), 20]  # layer 5 is the global one
    with torch.inference_mode():
        parts = ex.forward(torch.tensor(IDS), 0)
    assert parts is not None and ex.cache.base > 0  # the rows did move
    np.testing.assert_allclose(parts.numpy(), full, rtol=0, atol=1e-6 * np.abs(full).max())


@pytest.mark.parametrize("preset", PRESETS)
def test_greedy_tokens_equal_llama_cpps_for_32_steps(files: dict[str, Path],
                                                     reference: dict[str, Any],
                                                     preset: str) -> None:
    """32 greedy decode steps through the lab's KV cache on both sides; and, since random
    weights soon repeat one token, 40 decode steps fed the test's varied tokens (past
    gemma3's window), each step's logits against llama.cpp's prompt logits there."""
    import strata.lab

    path, prompt, steps = files[preset], IDS[:4], 32
    want, want_logits = llama_cpp_greedy(path, prompt, steps)
    got, got_logits = lab_greedy(path, prompt, steps)
    model = strata.lab.load(path, "cpu", n_ctx=64)
    with torch.inference_mode():
        fed = [model.prefill(IDS[:8])[-1].numpy()]
        fed += [model.decode(t)[-1].numpy() for t in IDS[8:]]
    assert got == want
    bound = BOUND.get(preset, 1e-4)
    scale = float(np.abs(want_logits).max())
    np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=bound * scale)
    assert float(rel_err(np.array(fed), reference[preset][7:]).max()) <= bound


@pytest.mark.parametrize("preset", PRESETS)
def test_quality_on_the_lab_equals_llama_cpps_perplexity(home: Path, preset: str) -> None:
    """`strata quality -B lab` against `-B llamacpp` (llama-perplexity's arithmetic) on the
    preset at q8_0: within 0.1% (measured within 0.004%; llama.cpp's K/V cache is f16
    there, the lab's f32)."""
    import json

    from tests.conftest import run_cli

    ppl = {}
    for backend in ("lab", "llamacpp"):
        r = run_cli("quality", f"synthetic:{preset}@q8_0", "-B", backend, "--ctx", "64",
                    "--max-chunks", "3", "--json", home=home)
        assert r.returncode == 0, r.stderr
        ppl[backend] = json.loads(r.stdout)[0]["ppl"]
    print(f"\n{preset}@q8_0 perplexity: lab {ppl['lab']:.4f}, llama.cpp {ppl['llamacpp']:.4f}")
    assert ppl["lab"] == pytest.approx(ppl["llamacpp"], rel=1e-3)


@pytest.mark.parametrize(("name", "total_b", "non_embedding_b"), [
    ("qwen3-0.6b", 0.6, 0.44),  # the Qwen3 model cards: total and non-embedding parameters
    ("qwen3-4b", 4.0, 3.6),
    ("qwen3-8b", 8.2, 6.95),
    ("gemma-3-270m", 0.27, 0.10),  # Gemma 3 270M card: 170M embedding + 100M transformer
    ("gemma-3-1b", 1.0, None),
    ("phi-3.5-mini", 3.8, None),  # Phi-3.5-mini card: 3.8B
    ("mistral-7b", 7.2, None),  # Mistral 7B paper: 7.3B (7.25B counted)
])
def test_published_presets_have_their_cards_sizes(name: str, total_b: float,
                                                  non_embedding_b: float | None) -> None:
    from strata.models.synthetic import parse_ref

    spec = parse_ref(f"synthetic:{name}@f16").gguf_spec()  # the plan only: nothing written
    assert spec.params() / 1e9 == pytest.approx(total_b, abs=0.05 * total_b)
    if non_embedding_b is not None:
        head = spec.tensor("output.weight")
        outside = spec.tensor("token_embd.weight").elements + (head.elements if head else 0)
        assert (spec.params() - outside) / 1e9 == pytest.approx(non_embedding_b, abs=0.05)


def test_llama_cpp_loads_and_decodes_a_published_gemma3_preset(home: Path) -> None:
    """gemma-3-270m at q4_0 as the synthetic writer writes it (262 144-token vocabulary,
    15 windowed layers): llama.cpp loads it, decodes, and agrees it is sliding-window."""
    from llama_cpp import Llama

    path = resolve("synthetic:gemma-3-270m@q4_0").path("gguf", "llamacpp")
    with quiet_stderr():
        llm = Llama(model_path=str(path), n_ctx=64, n_threads=2, logits_all=True,
                    verbose=False)
        try:
            llm.eval([1, 300, 301, 302])
            logits = np.array(llm.scores[3])
            meta = llm.metadata
        finally:
            llm.close()
    assert np.isfinite(logits).all() and logits.std() > 0
    assert meta["gemma3.attention.sliding_window"] == "512"
    assert read_spec_windowed(path) == 15


def read_spec_windowed(path: Path) -> int:
    from strata.models.gguf import read_spec

    return read_spec(path).windowed_layers()


# -- the ring ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ring() -> Iterator[LocalRing]:
    yield from local_ring(3)


@pytest.mark.parametrize(("preset", "world", "ops"), [
    ("tiny-qwen3", 2, "lab"), ("tiny-qwen3", 3, "torch"),
    ("tiny-llama3", 2, "torch"), ("tiny-llama3", 3, "lab"),
    ("tiny-gemma3", 2, "lab"), ("tiny-gemma3", 3, "torch"),
    ("tiny-phi3", 2, "torch"), ("tiny-phi3", 3, "lab"),
])
def test_ring_matches_llama_cpp(ring: LocalRing, files: dict[str, Path], preset: str,
                                world: int, ops: str) -> None:
    """Prompt logits and 24 greedy steps (gemma3: past its window) over 2 or 3 stages."""
    path, prompt, steps = files[preset], IDS[:8], 24
    want, want_logits = llama_cpp_greedy(path, prompt, steps + 1)
    res = ring_drive(ring, path, world, prompt, steps + 1, ops)
    got_logits = np.stack(res["step_logits"])
    bound = BOUND.get(preset, 1e-4) * float(np.abs(want_logits).max())
    err = float(np.abs(got_logits - want_logits).max())
    print(f"\n{preset} on {world} stages ({ops} ops): max |dlogits| {err:.1e} "
          f"(bound {bound:.1e}); tokens equal: {res['tokens'] == want}")
    assert res["tokens"] == want
    assert err <= bound


# -- architectures strata's engine does not run -------------------------------------------------


def write_foreign(path: Path, arch_name: str, heads: int, ssm: bool = False) -> Path:
    """A small GGUF of another architecture (metadata and tensors as its converter names
    them), with the synthetic vocabulary; llama.cpp's loader is not needed to refuse it."""
    import gguf

    from strata.models.synthetic_vocab import vocab_tokens

    w = gguf.GGUFWriter(path, arch_name)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(heads)
    w.add_context_length(512)
    if ssm:
        w.add_ssm_conv_kernel(4)
        w.add_ssm_inner_size(128)
        w.add_ssm_state_size(16)
    texts, types, scores = vocab_tokens(512)
    w.add_tokenizer_model("llama")
    w.add_token_list(texts)
    w.add_token_types(types)
    w.add_token_scores(scores)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((512, 64), dtype=np.float32))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_qkv.weight" if not ssm else f"blk.{i}.ssm_in.weight",
                     rng.standard_normal((192 if not ssm else 256, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_an_architecture_strata_cannot_run_is_one_line_naming_llama_cpp(
        home: Path, tmp_path: Path) -> None:
    from strata.ring.runtime.stage import Stage
    from tests.conftest import run_cli

    bert = write_foreign(tmp_path / "bert.gguf", "bert", heads=4)
    for backend in ("lab", "torch"):
        r = run_cli("bench", str(bert), "-B", backend, "-p", "8", "-n", "1", "-r", "1",
                    home=home)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "bert" in r.stderr and "llamacpp" in r.stderr
    with pytest.raises(Exception, match=r"strata ring runs the .*gemma3.* not bert.*llamacpp"):
        Stage.load(str(bert), 0, 1)
    # fit still plans it from its metadata, saying which figures are estimates
    r = run_cli("fit", str(bert), "--ctx", "256", "--json", home=home)
    assert r.returncode == 0, r.stderr
    import json

    out = json.loads(r.stdout)
    assert out["devices"][0]["weights_bytes"] == bert.stat().st_size - _header_bytes(bert)
    assert any("bert: not an architecture strata's engine runs" in n and "estimates" in n
               for n in out["notes"])
    # a recurrent model has no attention to size: one line, and what runs it
    mamba = write_foreign(tmp_path / "mamba.gguf", "mamba", heads=0, ssm=True)
    r = run_cli("fit", str(mamba), home=home)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "mamba has no attention heads (a recurrent (state-space) model)" in r.stderr
    assert "llamacpp" in r.stderr


def _header_bytes(path: Path) -> int:
    """Bytes before the tensor data (header, metadata, tensor infos, alignment)."""
    from strata.models.gguf import scan_or_input_error

    layout, _ = scan_or_input_error(path)
    return layout.data_offset
