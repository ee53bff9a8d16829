"""Synthetic models: presets, exact specs, cache, and what real llama.cpp / transformers make
of the written files (no mocks: real gguf, safetensors, llama-cpp-python, transformers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from strata.errors import InputError
from strata.models import synthetic
from strata.models.gguf import read_spec
from strata.models.presets import default_model, get_preset, list_presets, preset_names
from strata.models.source import resolve
from strata.models.spec import OUTPUT, TOKEN_EMBD
from strata.models.synthetic import (
    BOS_ID,
    FIRST_TEXT_ID,
    QUANTS,
    text_for_tokens,
    tokens_for_text,
)

gguf = pytest.importorskip("gguf")

TINY = ("tiny", "tiny-qwen2")


def _gguf(ref: str) -> Path:
    return resolve(ref).path("gguf", "llamacpp")


# -- presets and refs -------------------------------------------------------------------------


def test_presets_are_listed_from_the_data_file() -> None:
    names = preset_names()
    assert {"smollm2-135m", "qwen2.5-0.5b", "llama-3.1-8b", "tiny", "tiny-qwen2"} <= set(names)
    assert [p.name for p in list_presets()] == names
    assert default_model() == "synthetic:smollm2-135m@q8_0"
    p = get_preset("qwen2.5-0.5b")
    assert (p.arch, p.hidden, p.n_kv_heads, p.qkv_bias, p.tied_embeddings) == (
        "qwen2", 896, 2, True, True)


def test_default_quant_and_case(strata_home: Path) -> None:
    assert resolve("synthetic:tiny").spec.main_dtype() == "Q8_0"
    assert resolve("synthetic:tiny@Q4_0").spec.main_dtype() == "Q4_0"


@pytest.mark.parametrize(("ref", "words"), [
    ("synthetic:nope@q8_0", ["unknown preset", "smollm2-135m"]),
    ("synthetic:tiny@q5_k", ["unknown quant", "q4_0"]),
    ("synthetic:", ["unknown preset"]),
])
def test_bad_refs_are_input_errors(ref: str, words: list[str]) -> None:
    with pytest.raises(InputError) as err:
        resolve(ref)
    msg = str(err.value)
    assert "\n" not in msg and ref in msg
    for w in words:
        assert w in msg


# -- exact spec == what is in the file --------------------------------------------------------


@pytest.mark.parametrize("preset", TINY)
# strata's own writer; the llama.cpp mixes are written by llama.cpp (tests/test_mixes.py)
@pytest.mark.parametrize("quant", [q for q in QUANTS if not QUANTS[q].mix])
def test_spec_matches_the_written_gguf(strata_home: Path, preset: str, quant: str) -> None:
    model = resolve(f"synthetic:{preset}@{quant}")
    reader = gguf.GGUFReader(model.path("gguf", "llamacpp"))
    in_file = [(t.name, tuple(int(d) for d in reversed(t.shape)), t.tensor_type.name,
                int(t.n_bytes)) for t in reader.tensors]
    assert in_file == [(t.name, t.shape, t.dtype, t.nbytes) for t in model.spec.tensors]
    assert model.spec.weight_bytes() == sum(int(t.n_bytes) for t in reader.tensors)
    # norms stay F32, matrices carry the quant, the head exists only when untied
    assert model.spec.tensor("blk.0.attn_norm.weight").dtype == "F32"
    assert model.spec.tensor("blk.0.ffn_down.weight").dtype == QUANTS[quant].matrix
    assert model.spec.tensor(TOKEN_EMBD).dtype == QUANTS[quant].matrix
    assert (model.spec.tensor(OUTPUT) is None) == get_preset(preset).tied_embeddings
    field = reader.get_field(f"{get_preset(preset).arch}.block_count")
    assert field.contents() == get_preset(preset).n_layers


def test_qwen2_has_qkv_biases_in_f32(strata_home: Path) -> None:
    spec = resolve("synthetic:tiny-qwen2@q4_0").spec
    for name in ("attn_q.bias", "attn_k.bias", "attn_v.bias"):
        t = spec.tensor(f"blk.1.{name}")
        assert t is not None and t.dtype == "F32"
    assert resolve("synthetic:tiny@q4_0").spec.tensor("blk.0.attn_q.bias") is None


def test_quantised_blocks_have_sane_scales(strata_home: Path) -> None:
    reader = gguf.GGUFReader(_gguf("synthetic:tiny@q8_0"))
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
    blocks = np.asarray(t.data).reshape(-1, 34)
    scales = blocks[:, :2].copy().view(np.float16).ravel()
    assert np.all(np.isfinite(scales)) and np.all((scales > 0) & (scales < 0.01))
    quants = blocks[:, 2:].view(np.int8)
    assert quants.std() > 50  # random, not constant


def test_f16_weights_are_finite_and_small(strata_home: Path) -> None:
    reader = gguf.GGUFReader(_gguf("synthetic:tiny@f16"))
    w = np.asarray(next(t for t in reader.tensors if t.name == "blk.1.attn_q.weight").data)
    assert w.dtype == np.float16 and np.all(np.isfinite(w))
    assert 0.005 < np.abs(w).max() < 0.04 and w.std() > 0.005
    norm = np.asarray(next(t for t in reader.tensors if t.name == "output_norm.weight").data)
    assert np.all(norm == 1.0)


# -- cache ------------------------------------------------------------------------------------


def test_cache_is_content_keyed_and_reused(strata_home: Path) -> None:
    path = _gguf("synthetic:tiny@q4_0")
    assert path.is_relative_to(strata_home / "cache" / "models")
    stamp = path.stat().st_mtime_ns
    assert _gguf("synthetic:tiny@q4_0") == path and path.stat().st_mtime_ns == stamp
    assert _gguf("synthetic:tiny@q8_0") != path
    # no temp leftovers next to the published entries
    assert not [p for p in path.parent.parent.iterdir() if p.name.startswith(".tmp")]


def test_hf_artefact_is_shared_by_the_f16_quants(strata_home: Path) -> None:
    a = resolve("synthetic:tiny@q4_0").path("hf", "torch")
    b = resolve("synthetic:tiny@q8_0").path("hf", "torch")
    c = resolve("synthetic:tiny@f32").path("hf", "torch")
    assert a == b != c


def test_failed_write_leaves_no_entry(strata_home: Path) -> None:
    # A real write failure: the file-size limit makes the OS refuse bytes past 64 kB.
    script = (
        "import resource, signal\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\n"
        "from strata.errors import InputError\n"
        "from strata.models.source import resolve\n"
        "try:\n"
        "    resolve('synthetic:tiny@f32').path('gguf', 'llamacpp')\n"
        "except InputError as e:\n"
        "    print('INPUT-ERROR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.startswith("INPUT-ERROR"), out.stdout + out.stderr
    assert "File too large" in out.stdout and "STRATA_HOME" in out.stdout
    assert not any((strata_home / "cache" / "models").iterdir())


def test_unwritable_cache_is_an_input_error(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("STRATA_HOME", str(blocker))
    with pytest.raises(InputError, match="STRATA_HOME"):
        _gguf("synthetic:tiny@f16")


# -- tokenizer text <-> ids ---------------------------------------------------------------------


def test_text_round_trips_and_skips_surrogates() -> None:
    ids = [*range(FIRST_TEXT_ID, FIRST_TEXT_ID + 5), 151935, 60000]
    text = text_for_tokens(ids)
    assert len(text) == len(ids) and tokens_for_text(text) == ids
    text.encode("utf-8")  # no surrogates: would raise
    every = text_for_tokens(range(FIRST_TEXT_ID, FIRST_TEXT_ID + 70000))
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in every)
    with pytest.raises(ValueError):
        text_for_tokens([BOS_ID])
    with pytest.raises(ValueError):
        tokens_for_text("a")


# -- real llama.cpp -----------------------------------------------------------------------------


def _llama() -> object:
    return pytest.importorskip("llama_cpp")


@pytest.mark.parametrize("preset", TINY)
@pytest.mark.parametrize("quant", list(QUANTS))
def test_llama_cpp_tokenizes_text_exactly(strata_home: Path, preset: str, quant: str) -> None:
    llama_cpp = _llama()
    path = _gguf(f"synthetic:{preset}@{quant}")
    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    vocab = get_preset(preset).vocab
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(FIRST_TEXT_ID, vocab, 40)] + [vocab - 1]
    tokens = llm.tokenize(text_for_tokens(ids).encode("utf-8"), add_bos=True)
    assert tokens == [BOS_ID, *ids]
    assert llm.n_vocab() == vocab


def test_llama_cpp_survives_text_outside_the_vocab(strata_home: Path) -> None:
    llama_cpp = _llama()
    llm = llama_cpp.Llama(str(_gguf("synthetic:tiny@q8_0")), vocab_only=True, verbose=False)
    tokens = llm.tokenize(b"Hello, world\n", add_bos=True)
    # byte fallback: one token per UTF-8 byte (the space becomes "▁", 3 bytes)
    assert tokens[0] == BOS_ID and len(tokens) == 1 + len("Hello,▁world\n".encode())
    assert all(3 <= t < FIRST_TEXT_ID for t in tokens[1:])


@pytest.mark.parametrize("preset", TINY)
@pytest.mark.parametrize("quant", list(QUANTS))
def test_llama_cpp_loads_and_decodes(strata_home: Path, preset: str, quant: str) -> None:
    llama_cpp = _llama()
    path = _gguf(f"synthetic:{preset}@{quant}")
    llm = llama_cpp.Llama(str(path), n_ctx=64, n_batch=32, n_threads=2, logits_all=True,
                          verbose=False)
    ids = [BOS_ID, *range(FIRST_TEXT_ID, FIRST_TEXT_ID + 7)]
    llm.eval(ids)
    logits = np.asarray(llm.scores[llm.n_tokens - 1])
    assert llm.n_tokens == len(ids) and logits.shape == (get_preset(preset).vocab,)
    assert np.all(np.isfinite(logits)) and logits.std() > 0
    llm.eval([FIRST_TEXT_ID + 9])  # one more single-token decode step
    assert np.all(np.isfinite(llm.scores[llm.n_tokens - 1]))


# -- Hugging Face artefact ----------------------------------------------------------------------


@pytest.mark.parametrize("preset", TINY)
def test_hf_artefact_matches_its_spec(strata_home: Path, preset: str) -> None:
    safetensors = pytest.importorskip("safetensors")
    model = resolve(f"synthetic:{preset}@q4_0")
    folder = model.path("hf", "torch")
    spec = model.spec_for("hf")
    assert spec.main_dtype() == "F16" and spec is not model.spec
    assert any("unquantised" in n for n in spec.notes)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [
        {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[get_preset(preset).arch]]
    with safetensors.safe_open(folder / "model.safetensors", "np") as f:
        keys = set(f.keys())
        embed = f.get_tensor("model.embed_tokens.weight")
    assert len(keys) == len(spec.tensors)
    assert embed.shape == spec.tensor(TOKEN_EMBD).shape and embed.dtype == np.float16
    assert ("lm_head.weight" in keys) != get_preset(preset).tied_embeddings
    # the HF resolver reads the same directory back to the same spec
    assert resolve(str(folder)).spec.tensors == spec.tensors


@pytest.mark.parametrize("preset", TINY)
def test_transformers_runs_the_hf_artefact(strata_home: Path, preset: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = resolve(f"synthetic:{preset}@f32").path("hf", "torch")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert type(model).__name__ == json.loads((folder / "config.json").read_text())[
        "architectures"][0]
    with torch.no_grad():
        logits = model(torch.tensor([[BOS_ID, FIRST_TEXT_ID, FIRST_TEXT_ID + 1]])).logits
    assert logits.shape == (1, 3, get_preset(preset).vocab)
    assert torch.isfinite(logits).all() and logits.std() > 0


# -- size and speed -----------------------------------------------------------------------------


def test_smollm2_q4_0_writes_in_seconds(strata_home: Path) -> None:
    model = resolve("synthetic:smollm2-135m@q4_0")
    start = time.perf_counter()
    path = model.path("gguf", "llamacpp")
    seconds = time.perf_counter() - start
    size = path.stat().st_size
    print(f"\nsynthetic:smollm2-135m@q4_0: {size / 1e6:.1f} MB written in {seconds:.2f} s")
    reader = gguf.GGUFReader(path)
    padded = sum(t.nbytes + (-t.nbytes % 32) for t in model.spec.tensors)
    assert size == reader.data_offset + padded
    # metadata (49152-token vocab, tensor infos) is a small margin on top of the weights
    assert model.spec.weight_bytes() < size < model.spec.weight_bytes() + 2_000_000


def test_concurrent_writers_end_with_one_complete_model(strata_home: Path) -> None:
    script = ("from strata.models.source import resolve\n"
              "print(resolve('synthetic:smollm2-135m@q8_0').path('gguf', 'llamacpp'))\n")
    env = {**os.environ, "STRATA_HOME": str(strata_home)}
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    paths = {out.strip() for out, _err in outs}
    assert len(paths) == 1
    spec = resolve("synthetic:smollm2-135m@q8_0").spec
    assert read_spec(Path(paths.pop())).tensors == spec.tensors
    assert not list((strata_home / "cache" / "models").glob(".tmp-*"))


def test_stale_temp_dirs_are_swept(strata_home: Path) -> None:
    models = strata_home / "cache" / "models"
    stale, fresh = models / ".tmp-old-killed", models / ".tmp-live-writer"
    for d in (stale, fresh):
        d.mkdir(parents=True)
        (d / "part.gguf").write_bytes(b"x")
    old = time.time() - synthetic.STALE_SECONDS - 60
    os.utime(stale, (old, old))
    _gguf("synthetic:tiny@q4_0")
    assert not stale.exists() and fresh.exists()


def test_text_id_range_is_all_text() -> None:
    ids = synthetic.text_id_range(512)
    assert ids.start == FIRST_TEXT_ID and ids.stop == 512
    assert len(text_for_tokens(ids)) == len(ids)


def test_llama_cpp_round_trips_a_real_size_vocab(strata_home: Path) -> None:
    """151936 tokens reach past the BMP (4-byte UTF-8): still one token per character."""
    llama_cpp = _llama()
    llm = llama_cpp.Llama(str(_gguf("synthetic:qwen2.5-0.5b@q4_0")), vocab_only=True,
                          verbose=False)
    vocab = get_preset("qwen2.5-0.5b").vocab
    assert llm.n_vocab() == vocab
    ids = [FIRST_TEXT_ID, 0xD7FF - 0x4E00, 0xE000 - 0x4E00, 70000, vocab - 2, vocab - 1]
    ids += [int(i) for i in np.random.default_rng(1).integers(FIRST_TEXT_ID, vocab, 500)]
    text = text_for_tokens(ids)
    assert max(ord(c) for c in text) > 0xFFFF
    assert llm.tokenize(text.encode("utf-8"), add_bos=True) == [BOS_ID, *ids]
    # and back: llama.cpp's pieces are the same characters
    assert llm.detokenize(ids).decode("utf-8") == text
