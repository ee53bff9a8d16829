"""llama.cpp's quantisation mixes (issue "Real files: the K-quant GGUFs people download"):
strata's restatement of llama.cpp's per-tensor rules (models/mixes.py) against llama.cpp's
own quantizer, the K-quant synthetic presets it writes, and `strata fit` on a mix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strata.models import mixes
from strata.models.gguf import read_spec
from strata.models.presets import get_preset
from strata.models.synthetic import SyntheticModel, parse_ref
from tests.conftest import run_cli

# tiny: rows of 64 (every K type falls back: Q4_K -> Q5_0, Q6_K -> Q8_0, Q2_K -> Q4_0, ...);
# tiny-k: whole 256-value rows, 8 layers (the more-bits layers differ), 4 query heads per
# KV head; tiny-k-qwen2: tied embeddings (the token table is quantised like a head) and
# biases; tiny-moe: 8 experts (llama.cpp's 8-expert rules for attn_v, attn_k, attn_output)
PRESETS = ("tiny", "tiny-k", "tiny-k-qwen2", "tiny-moe")


def _stored(path: Path) -> dict[str, tuple[str, int]]:
    return {t.name: (t.dtype, t.nbytes) for t in read_spec(path).tensors}


@pytest.fixture(scope="module")
def quantised(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Every preset at every mix, written by llama.cpp's quantizer from the f16 preset."""
    pytest.importorskip("llama_cpp")
    from strata.backends.llamacpp_quantize import quantize_gguf

    out = tmp_path_factory.mktemp("mixes")
    files = {}
    for preset in PRESETS:
        src = SyntheticModel(get_preset(preset), "f16").gguf_path()
        for key, mix in mixes.MIXES.items():
            files[preset, key] = out / f"{preset}-{key}.gguf"
            quantize_gguf(src, files[preset, key], mix.ftype, threads=2)
    return files


@pytest.mark.parametrize("preset", PRESETS)
def test_every_tensor_gets_the_type_and_bytes_llama_cpp_gives_it(
        preset: str, quantised: dict[tuple[str, str], Path]) -> None:
    spec = SyntheticModel(get_preset(preset), "f16").gguf_spec()
    for key, mix in mixes.MIXES.items():
        real = _stored(quantised[preset, key])
        mine = {t.name: (t.dtype, t.nbytes) for t in mixes.requantised(spec, mix)}
        wrong = {n: (mine.get(n), real[n]) for n in real if mine.get(n) != real[n]}
        assert not wrong, f"{preset}@{key}: (strata, llama.cpp) {list(wrong.items())[:4]}"
        assert read_spec(quantised[preset, key]).file_type == mix.name


def test_the_rules_single_out_what_llama_cpp_singles_out() -> None:
    """The rules are not one type per mix: on tiny-k, Q4_K_M keeps Q4_K for most matrices,
    Q6_K for attn_v/ffn_down in the more-bits layers (by hand from llama.cpp's
    use_more_bits, n = 8: layers < 1, >= 7, and (i - 1) % 3 == 2: 0, 3, 6, 7)."""
    assert [i for i in range(8) if mixes._more_bits(i, 8)] == [0, 3, 6, 7]
    spec = SyntheticModel(get_preset("tiny-k"), "f16").gguf_spec()
    types = mixes.tensor_types(spec, mixes.MIXES["q4_k_m"])
    six = sorted(int(n.split(".")[1]) for n, t in types.items()
                 if t == "Q6_K" and n.endswith("ffn_down.weight"))
    assert six == [0, 3, 6, 7]
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert types["blk.1.attn_q.weight"] == "Q4_K" and types["blk.0.attn_norm.weight"] == "F32"
    # rows of 64: no K block fits, llama.cpp's fallbacks
    tiny = mixes.tensor_types(SyntheticModel(get_preset("tiny"), "f16").gguf_spec(),
                              mixes.MIXES["q4_k_m"])
    assert tiny["blk.1.attn_q.weight"] == "Q5_0" and tiny["output.weight"] == "Q8_0"


def test_a_k_quant_preset_is_written_by_llama_cpp_and_sized_before(strata_home: Path) -> None:
    pytest.importorskip("llama_cpp")
    model = parse_ref("synthetic:tiny-k@q4_k_m")
    planned = model.gguf_spec()  # nothing written yet
    assert planned.file_type == "Q4_K_M" and not any(strata_home.rglob("*.gguf"))
    path = model.gguf_path()
    assert {t.name: (t.dtype, t.nbytes) for t in planned.tensors} == _stored(path)
    assert read_spec(path).file_type == "Q4_K_M"
    mtime = path.stat().st_mtime_ns
    assert parse_ref("synthetic:tiny-k@q4_k_m").gguf_path() == path  # cached
    assert path.stat().st_mtime_ns == mtime


def test_fit_names_the_mix_and_sizes_every_mix_exactly(
        strata_home: Path, quantised: dict[tuple[str, str], Path]) -> None:
    """A Q4_K_M file is labelled Q4_K_M (its largest type is another: the bug this fixes),
    and "weights at each quantisation" equals what llama.cpp writes at each mix."""
    path = quantised["tiny", "q4_k_m"]
    largest = read_spec(path).main_dtype()
    assert largest not in ("Q4_K", "Q6_K")  # rows of 64: the largest type is a fallback
    r = run_cli("fit", str(path), "-o", "json", home=strata_home)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    model = doc["model"]
    assert model["quant"] == "Q4_K_M" and model["dtype"] == largest
    assert sum(model["bytes_by_type"].values()) == model["model_size"] == \
        sum(n for _, n in _stored(path).values())
    sizes = {q["quant"]: q for q in doc["quantisations"]}
    assert list(sizes) == list(mixes.MIXES)
    for key in mixes.MIXES:
        real = sum(n for _, n in _stored(quantised["tiny", key]).values())
        assert sizes[key]["exact"] and sizes[key]["weight_bytes"] == real, key
    table = run_cli("fit", str(path), home=strata_home)
    assert table.returncode == 0, table.stderr
    assert "(Q4_K_M)" in table.stdout and "weights as stored (Q4_K_M): " in table.stdout


def test_ring_plan_sizes_a_mix_as_stored(strata_home: Path) -> None:
    """A ring member holds the file's bytes as stored: the mix's per-tensor bytes, which
    llama.cpp's rules give before any file exists."""
    planned = parse_ref("synthetic:tiny-k@q4_k_m").gguf_spec()
    r = run_cli("ring", "plan", "synthetic:tiny-k@q4_k_m", "--node", "a:1", "-o", "json",
                home=strata_home)
    assert r.returncode == 0, r.stderr
    [stage] = json.loads(r.stdout)["stages"]
    assert stage["weights_bytes"] == planned.weight_bytes()
    assert set(planned.bytes_by_type()) == {"Q4_K", "Q6_K", "F32"}
