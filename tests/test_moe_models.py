"""Mixture-of-experts models: synthetic MoE presets written as GGUF (run by real llama.cpp)
and as HF folders (run by real transformers), and the ModelSpec's MoE accounting checked
against hand computations from the shapes — never against strata's own arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from strata.errors import InputError
from strata.models.gguf import read_spec
from strata.models.hf import gguf_name, hf_name, spec_from_dir
from strata.models.presets import get_preset, list_presets
from strata.models.spec import ModelSpec, TensorInfo, is_expert_tensor
from strata.models.synthetic import BOS_ID, FIRST_TEXT_ID, parse_ref

gguf = pytest.importorskip("gguf")


def _q8_0(n: int) -> int:
    return n // 32 * 34  # a block of 32 values: fp16 scale + 32 int8


def _q4_0(n: int) -> int:
    return n // 32 * 18  # a block of 32 values: fp16 scale + 16 bytes of nibbles


def _f32(n: int) -> int:
    return 4 * n


QUANT_BYTES = {"q8_0": _q8_0, "q4_0": _q4_0}


def _tiny_moe_by_hand(quant: str) -> dict[str, int]:
    """tiny-moe's figures from its shapes (hidden 64, 4 heads / 2 kv of 16, vocab 512,
    2 layers, 8 experts of width 64, 2 per token, untied head): matrices at the quant,
    norms and the router F32 (llama.cpp keeps ffn_gate_inp unquantised)."""
    m = QUANT_BYTES[quant]
    embd = m(512 * 64)  # token_embd (512, 64)
    head = m(512 * 64)  # output (512, 64)
    shared_layer = (_f32(64)  # attn_norm
                    + m(64 * 64) + m(32 * 64) + m(32 * 64)  # attn_q, attn_k, attn_v
                    + _f32(16) + _f32(16)  # attn_q_norm, attn_k_norm (head_dim)
                    + m(64 * 64)  # attn_output
                    + _f32(64)  # ffn_norm
                    + _f32(8 * 64))  # ffn_gate_inp: the router, (8 experts, 64)
    experts_layer = 3 * m(8 * 64 * 64)  # ffn_{gate,up,down}_exps (8, 64, 64)
    one_expert_layer = 3 * m(64 * 64)
    total = embd + head + _f32(64) + 2 * (shared_layer + experts_layer)  # + output_norm
    per_token = (embd // 512  # the embedding is a lookup: one row
                 + head + _f32(64) + 2 * shared_layer
                 + 2 * 2 * one_expert_layer)  # 2 layers x 2 experts used
    params = 2 * 512 * 64 + 64 + 2 * (64 + 64 * 64 + 2 * 32 * 64 + 2 * 16 + 64 * 64 + 64
                                      + 8 * 64 + 3 * 8 * 64 * 64)
    active = params - 512 * 64 - 2 * 6 * 3 * 64 * 64  # no embedding, 6 idle experts a layer
    return {"total": total, "per_token": per_token, "experts": 2 * experts_layer,
            "params": params, "active_params": active}


def test_hand_figures_written_out() -> None:
    """The hand computation itself, as plain numbers (q8_0: 34 B / 32 values)."""
    assert _tiny_moe_by_hand("q8_0") == {"total": 310272, "per_token": 118852,
                                         "experts": 208896, "params": 288128,
                                         "active_params": 107904}
    assert _tiny_moe_by_hand("q4_0")["total"] == 166912
    assert _tiny_moe_by_hand("q4_0")["per_token"] == 65572


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_tiny_moe_bytes_equal_the_hand_computation(strata_home: Path, quant: str) -> None:
    model = parse_ref(f"synthetic:tiny-moe@{quant}")
    path = model.gguf_path()
    hand = _tiny_moe_by_hand(quant)
    for spec in (model.gguf_spec(), read_spec(path)):  # the preset's, and the file's
        assert (spec.n_experts, spec.n_experts_used, spec.expert_ffn) == (8, 2, 64)
        assert spec.weight_bytes() == hand["total"]  # memory: every expert
        assert spec.expert_bytes() == hand["experts"]
        assert spec.active_weight_bytes() == hand["per_token"]  # decode: 2 of 8 experts
        assert spec.streamed_weight_bytes() == hand["per_token"]  # what the roofline reads
        assert spec.params() == hand["params"]
        assert spec.active_params() == hand["active_params"]
    # the file holds exactly those bytes (every tensor here is a multiple of the alignment)
    reader = gguf.GGUFReader(path)
    assert sum(int(t.n_bytes) for t in reader.tensors) == hand["total"]
    assert path.stat().st_size == reader.data_offset + hand["total"]
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"
    assert types["blk.1.ffn_down_exps.weight"] == quant.upper()


@pytest.mark.parametrize("ref", ["synthetic:tiny-moe@q8_0", "synthetic:tiny-moe@f16",
                                 "synthetic:tiny-mixtral@q4_0", "synthetic:tiny-mixtral@f32"])
def test_spec_read_back_from_the_gguf_equals_the_presets(strata_home: Path, ref: str) -> None:
    model = parse_ref(ref)
    expected, found = model.gguf_spec(), read_spec(model.gguf_path())
    assert replace(found, source=expected.source, notes=expected.notes) == expected
    reader = gguf.GGUFReader(model.gguf_path())
    arch = model.preset.arch
    assert reader.fields[f"{arch}.expert_count"].contents() == model.preset.n_experts
    assert reader.fields[f"{arch}.expert_used_count"].contents() == model.preset.n_experts_used
    # qwen3moe writes the expert width; a Mixtral (llama) GGUF has none, as the converter's
    assert (f"{arch}.expert_feed_forward_length" in reader.fields) == (arch == "qwen3moe")
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}  # GGUF ne[]
    p = model.preset
    assert shapes["blk.0.ffn_gate_exps.weight"] == (p.hidden, p.expert_ffn, p.n_experts)
    assert shapes["blk.0.ffn_down_exps.weight"] == (p.expert_ffn, p.hidden, p.n_experts)
    assert shapes["blk.0.ffn_gate_inp.weight"] == (p.hidden, p.n_experts)
    assert ("blk.0.attn_q_norm.weight" in shapes) == (arch == "qwen3moe")
    assert "blk.0.ffn_gate.weight" not in shapes


_LLAMA_SCRIPT = """
import json, sys
import numpy as np
import llama_cpp
from llama_cpp import llama_cpp as C

path, ids = sys.argv[1], json.loads(sys.argv[2])
params = C.llama_model_default_params()
params.use_extra_bufts = False  # see the test's docstring
model = C.llama_model_load_from_file(path.encode(), params)
out = {"size": C.llama_model_size(model), "n_params": C.llama_model_n_params(model)}
C.llama_model_free(model)
C.llama_model_default_params = lambda: params  # Llama() builds its params from this
llm = llama_cpp.Llama(path, n_ctx=64, n_batch=32, n_threads=2, logits_all=True, verbose=False)
llm.eval(ids)
logits = [np.asarray(llm.scores[llm.n_tokens - 1])]
for step in range(3):  # three single-token decode steps
    llm.eval([ids[-1] + 1 + step])
    logits.append(np.asarray(llm.scores[llm.n_tokens - 1]))
out.update(n_tokens=llm.n_tokens, finite=bool(all(np.isfinite(x).all() for x in logits)),
           std=float(min(x.std() for x in logits)), n_vocab=llm.n_vocab(),
           experts=llm.metadata.get(llm.metadata["general.architecture"] + ".expert_count"))
print(json.dumps(out))
"""


@pytest.mark.parametrize("ref", ["synthetic:tiny-moe@q8_0", "synthetic:tiny-moe@q4_0",
                                 "synthetic:tiny-moe@f16", "synthetic:tiny-mixtral@q8_0"])
def test_llama_cpp_loads_and_decodes_the_moe(strata_home: Path, ref: str) -> None:
    """Real llama.cpp loads the written MoE GGUF, counts its bytes and parameters as we do,
    and decodes. Run in a subprocess with llama.cpp's extra CPU buffer types (AMX/repack)
    off: on this host they crash quantised matmuls of dense models too, and a crash must
    fail this test, not end the test session."""
    pytest.importorskip("llama_cpp")
    model = parse_ref(ref)
    spec = model.gguf_spec()
    ids = [BOS_ID, *range(FIRST_TEXT_ID, FIRST_TEXT_ID + 5)]
    run = subprocess.run([sys.executable, "-c", _LLAMA_SCRIPT, str(model.gguf_path()),
                          json.dumps(ids)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["size"] == spec.weight_bytes()  # llama.cpp's own sum of tensor bytes
    assert out["n_params"] == spec.params()
    assert out["experts"] == str(model.preset.n_experts)
    assert out["n_tokens"] == len(ids) + 3 and out["n_vocab"] == model.preset.vocab
    assert out["finite"] and out["std"] > 0


def test_transformers_runs_the_moe_hf_folder(strata_home: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    safetensors = pytest.importorskip("safetensors")
    model = parse_ref("synthetic:tiny-moe@f32")
    folder = model.hf_path()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (config["num_experts"], config["num_experts_per_tok"],
            config["moe_intermediate_size"]) == (8, 2, 64)
    # the HF resolver reads the folder back to the same spec, experts and all
    spec = spec_from_dir(folder)
    assert spec.tensors == model.hf_spec().tensors
    assert (spec.n_experts, spec.n_experts_used, spec.expert_ffn) == (8, 2, 64)
    assert spec.weight_bytes() == model.hf_spec().weight_bytes()
    assert spec.active_weight_bytes() < spec.weight_bytes()
    lm, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert type(lm).__name__ == "Qwen3MoeForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    # expert 5 of layer 1 holds the file's weights (not a fresh initialisation)
    with safetensors.safe_open(folder / "model.safetensors", "pt") as f:
        down = f.get_tensor("model.layers.1.mlp.experts.5.down_proj.weight")
    state = lm.state_dict()
    loaded = state.get("model.layers.1.mlp.experts.5.down_proj.weight")
    if loaded is None:  # transformers >= 5 fuses a layer's experts into one 3-D tensor
        loaded = state["model.layers.1.mlp.experts.down_proj"][5]
    assert torch.equal(loaded, down)
    with torch.no_grad():
        logits = lm(torch.tensor([[BOS_ID, FIRST_TEXT_ID, FIRST_TEXT_ID + 1]])).logits
    assert logits.shape == (1, 3, 512) and torch.isfinite(logits).all() and logits.std() > 0


def test_mixtral_hf_folder_uses_mixtral_names(strata_home: Path) -> None:
    model = parse_ref("synthetic:tiny-mixtral@f16")
    folder = model.hf_path()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["MixtralForCausalLM"]
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (4, 2)
    header = (folder / "model.safetensors").read_bytes()
    n = int.from_bytes(header[:8], "little")
    names = set(json.loads(header[8:8 + n])) - {"__metadata__"}
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in names
    assert "model.layers.0.block_sparse_moe.gate.weight" in names
    spec = spec_from_dir(folder)
    assert (spec.n_experts, spec.n_experts_used, spec.expert_ffn) == (4, 2, 128)
    assert spec.tensors == model.hf_spec().tensors


def test_expert_names_map_both_ways() -> None:
    for style, hf in [("mlp", "model.layers.3.mlp.experts.7.up_proj.weight"),
                      ("block_sparse_moe", "model.layers.3.block_sparse_moe.experts.7.w3.weight")]:
        assert gguf_name(hf) == "blk.3.ffn_up.7.weight"
        assert hf_name("blk.3.ffn_up.7.weight", style) == hf
    assert gguf_name("model.layers.2.mlp.gate.weight") == "blk.2.ffn_gate_inp.weight"
    assert gguf_name("model.layers.2.mlp.experts.down_proj") == "blk.2.ffn_down_exps.weight"
    assert gguf_name("model.layers.0.self_attn.q_norm.weight") == "blk.0.attn_q_norm.weight"
    assert is_expert_tensor("blk.0.ffn_gate_exps.weight")
    assert is_expert_tensor("blk.10.ffn_gate_up_exps.weight")
    assert is_expert_tensor("blk.0.ffn_down.3.weight")
    for shared in ("blk.0.ffn_gate_inp.weight", "blk.0.ffn_up_shexp.weight",
                   "blk.0.ffn_gate.weight", "blk.0.ffn_gate_inp_shexp.weight"):
        assert not is_expert_tensor(shared)


# -- published presets: shapes and MoE accounting against the model cards ------------------


@pytest.mark.parametrize(("name", "total_b", "active_b"), [
    ("qwen3-30b-a3b", 30.5, 3.3),  # Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
    ("mixtral-8x7b", 46.7, 12.9),  # Mixtral of experts (arXiv:2401.04088): 47B / 13B active
])
def test_published_moe_presets_have_their_cards_sizes(name: str, total_b: float,
                                                      active_b: float) -> None:
    spec = parse_ref(f"synthetic:{name}@q8_0").gguf_spec()  # the plan only: nothing written
    embd = spec.tensor("token_embd.weight")
    assert round(spec.params() / 1e9, 1) == total_b
    # the cards count the embedding among the active parameters; active_params() does not
    assert (spec.active_params() + embd.elements) / 1e9 == pytest.approx(active_b, abs=0.06)
    if name == "qwen3-30b-a3b":  # its card: 29.9B without the embedding and the head
        head = spec.tensor("output.weight")
        assert round((spec.params() - embd.elements - head.elements) / 1e9, 1) == 29.9
    # decode reads n_experts_used of the experts: far less than the whole model
    ratio = spec.active_weight_bytes() / spec.weight_bytes()
    assert ratio == pytest.approx({"qwen3-30b-a3b": 0.1007, "mixtral-8x7b": 0.2730}[name],
                                  abs=5e-4)


def test_moe_presets_are_listed_with_their_experts() -> None:
    presets = {p.name: p for p in list_presets()}
    assert {"qwen3-30b-a3b", "mixtral-8x7b", "tiny-moe", "tiny-mixtral"} <= set(presets)
    assert presets["qwen3-30b-a3b"].experts_label == "128x8"
    assert presets["mixtral-8x7b"].experts_label == "8x2"
    assert presets["tiny"].experts_label == ""
    for p in presets.values():
        if p.is_moe:
            assert 0 < p.n_experts_used <= p.n_experts and p.expert_ffn > 0
            assert "config.json" in p.source or p.name.startswith("tiny")


# -- dense presets are what they were ---------------------------------------------------------


def test_dense_presets_keep_their_content_keys() -> None:
    """Files already in users' caches stay valid: a dense preset's hashed values carry no
    MoE field, so its keys are the ones computed before MoE existed (pinned here)."""
    assert "n_experts" not in get_preset("tiny").values()
    assert parse_ref("synthetic:tiny@q8_0").content_key("gguf") == \
        "tiny-gguf-q8_0-4d9e9041311c8edc"
    assert parse_ref("synthetic:tiny-qwen2@q4_0").content_key("hf") == \
        "tiny-qwen2-hf-f16-4407e15d068b77d1"
    assert parse_ref("synthetic:smollm2-135m@q8_0").content_key("gguf") == \
        "smollm2-135m-gguf-q8_0-c19becbf87921ecb"
    assert get_preset("tiny-moe").values()["n_experts"] == 8


def test_dense_spec_has_no_moe_accounting() -> None:
    spec = parse_ref("synthetic:tiny@q8_0").gguf_spec()
    assert not spec.is_moe and spec.expert_bytes() == 0 and spec.bytes_per_expert() == 0
    assert spec.shared_weight_bytes() == spec.weight_bytes()
    assert "n_experts" not in spec.to_dict()
    moe = parse_ref("synthetic:tiny-moe@q8_0").gguf_spec().to_dict()
    assert (moe["n_experts"], moe["active_weight_bytes"]) == (8, 118852)


def test_gguf_with_impossible_expert_metadata_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_head_count(1)
    w.add_expert_count(4)
    w.add_expert_used_count(0)  # llama.cpp refuses this: "n_expert_used must be > 0"
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InputError, match="expert_used_count"):
        read_spec(path)


def test_spec_without_experts_of_an_moe_name_is_still_dense() -> None:
    """With no expert count, a tensor that merely looks like an expert is read whole."""
    t = TensorInfo("blk.0.ffn_up_exps.weight", (2, 8, 8), "F32", 512)
    spec = ModelSpec(name="x", arch="llama", n_layers=1, n_heads=1, n_kv_heads=1,
                     head_dim=8, hidden=8, ffn=8, vocab=4, ctx_max=16, tied_embeddings=True,
                     tensors=[t])
    assert spec.active_params() == 128 and spec.active_weight_bytes() == 512
    moe = replace(spec, n_experts=2, n_experts_used=1, expert_ffn=8)
    assert moe.active_params() == 64 and moe.active_weight_bytes() == 256
