"""Hugging Face directories: spec from config.json + safetensors headers, and one-line
InputErrors for directories and files that are missing pieces or lie."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from strata.errors import InputError
from strata.models.hf import gguf_name, hf_name
from strata.models.source import resolve
from strata.models.spec import OUTPUT, TOKEN_EMBD

safetensors = pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402


@pytest.fixture
def tiny_dir(strata_home: Path, tmp_path: Path) -> Path:
    """A private copy of the synthetic tiny model as a HF directory (untied, F16)."""
    src = resolve("synthetic:tiny@q8_0").path("hf", "torch")
    return Path(shutil.copytree(src, tmp_path / "tiny"))


def _error(path: Path, *words: str) -> str:
    with pytest.raises(InputError) as err:
        resolve(str(path))
    msg = str(err.value)
    assert "\n" not in msg and "MODEL " in msg
    for w in words:
        assert w in msg, msg
    return msg


def _read_st(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_st(path: Path, header: dict[str, Any], data: bytes) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def _edit_config(folder: Path, **changes: Any) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k)
        else:
            cfg[k] = v
    (folder / "config.json").write_text(json.dumps(cfg))


# -- valid directories ------------------------------------------------------------------------


def test_spec_from_config_and_headers(tiny_dir: Path) -> None:
    model = resolve(str(tiny_dir))
    spec = model.spec
    assert model.kind == "hf" and model.path("hf", "torch") == tiny_dir
    assert (spec.arch, spec.hidden, spec.ffn, spec.n_layers, spec.n_heads, spec.n_kv_heads,
            spec.head_dim, spec.vocab, spec.ctx_max) == ("llama", 64, 128, 2, 4, 2, 16, 512, 2048)
    assert not spec.tied_embeddings and spec.tensor(OUTPUT) is not None
    assert spec.tensor(TOKEN_EMBD).shape == (512, 64)
    # the headers agree with the safetensors library, tensor by tensor
    with safetensors.safe_open(tiny_dir / "model.safetensors", "np") as f:
        theirs = {gguf_name(k): (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype())
                  for k in f.keys()}  # noqa: SIM118  (safe_open is not a mapping)
    assert theirs == {t.name: (t.shape, t.dtype) for t in spec.tensors}
    assert spec.weight_bytes() == (tiny_dir / "model.safetensors").stat().st_size - 8 - \
        struct.unpack("<Q", (tiny_dir / "model.safetensors").read_bytes()[:8])[0]


def test_names_map_both_ways() -> None:
    for name in (TOKEN_EMBD, OUTPUT, "output_norm.weight", "blk.7.attn_q.bias",
                 "blk.12.ffn_down.weight"):
        assert gguf_name(hf_name(name)) == name
    assert gguf_name("model.layers.3.mlp.up_proj.weight") == "blk.3.ffn_up.weight"
    assert gguf_name("model.rotary_emb.inv_freq") == "model.rotary_emb.inv_freq"


def test_sharded_directory_with_index(tiny_dir: Path, tmp_path: Path) -> None:
    single = resolve(str(tiny_dir)).spec
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(tiny_dir / "config.json", sharded)
    with safetensors.safe_open(tiny_dir / "model.safetensors", "np") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    names = sorted(tensors)
    parts = {"model-00001-of-00002.safetensors": names[::2],
             "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in parts.items():
        save_file({k: tensors[k] for k in keys}, sharded / file, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    spec = resolve(str(sharded)).spec
    assert sorted(spec.tensors, key=lambda t: t.name) == sorted(single.tensors,
                                                                key=lambda t: t.name)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    _error(sharded, "model-00002-of-00002.safetensors", "missing")


def test_tied_when_the_head_is_absent(tiny_dir: Path) -> None:
    st = tiny_dir / "model.safetensors"
    header, data = _read_st(st)
    head = header.pop("lm_head.weight")
    begin, end = head["data_offsets"]
    assert end == len(data)  # last tensor: dropping it keeps the others' offsets
    _write_st(st, header, data[:begin])
    spec = resolve(str(tiny_dir)).spec
    assert spec.tied_embeddings and spec.tensor(OUTPUT) is None


def test_head_dim_null_falls_back_to_hidden_over_heads(tiny_dir: Path) -> None:
    _edit_config(tiny_dir, head_dim=None)
    assert resolve(str(tiny_dir)).spec.head_dim == 16


# -- bad input --------------------------------------------------------------------------------


def test_directory_without_config(tmp_path: Path) -> None:
    _error(tmp_path, "no config.json")


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "intermediate_size", "vocab_size"])
def test_config_missing_field(tiny_dir: Path, key: str) -> None:
    _edit_config(tiny_dir, **{key: ...})
    _error(tiny_dir, f"lacks {key}", "config.json")


def test_config_field_of_wrong_type(tiny_dir: Path) -> None:
    _edit_config(tiny_dir, num_hidden_layers="thirty")
    _error(tiny_dir, "num_hidden_layers", "'thirty'")


def test_config_not_json(tiny_dir: Path) -> None:
    (tiny_dir / "config.json").write_text("{ not json")
    _error(tiny_dir, "config.json", "not valid JSON")


def test_no_weights(tiny_dir: Path) -> None:
    (tiny_dir / "model.safetensors").unlink()
    _error(tiny_dir, "no *.safetensors")


def test_header_length_beyond_file(tiny_dir: Path) -> None:
    st = tiny_dir / "model.safetensors"
    raw = st.read_bytes()
    st.write_bytes(struct.pack("<Q", 2**60) + raw[8:])
    _error(tiny_dir, "model.safetensors", f"claims {2**60} bytes")


def test_too_short_file(tiny_dir: Path) -> None:
    (tiny_dir / "model.safetensors").write_bytes(b"\x01\x02")
    _error(tiny_dir, "too short")


def test_header_not_json(tiny_dir: Path) -> None:
    st = tiny_dir / "model.safetensors"
    raw = bytearray(st.read_bytes())
    raw[8:20] = b"#" * 12
    st.write_bytes(bytes(raw))
    _error(tiny_dir, "header is not valid JSON")


def test_data_offsets_beyond_file(tiny_dir: Path) -> None:
    st = tiny_dir / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-100])  # truncated: the last tensor ends past the file
    _error(tiny_dir, "lm_head.weight", "data_offsets end at")


def test_header_that_lies_about_a_size(tiny_dir: Path) -> None:
    st = tiny_dir / "model.safetensors"
    header, data = _read_st(st)
    header["model.norm.weight"]["shape"] = [6400]  # offsets still span 64 x F16
    _write_st(st, header, data)
    _error(tiny_dir, "model.norm.weight", "the header lies")


def test_unknown_dtype(tiny_dir: Path) -> None:
    st = tiny_dir / "model.safetensors"
    header, data = _read_st(st)
    header["model.norm.weight"]["dtype"] = "F12"
    _write_st(st, header, data)
    _error(tiny_dir, "unknown dtype 'F12'")


def test_real_safetensors_files_are_read_exactly(tmp_path: Path) -> None:
    """Files written by the safetensors library itself (BF16-like U16 and I8 included)."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "mistral", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
        "tie_word_embeddings": True}))
    save_file({"model.embed_tokens.weight": np.zeros((10, 32), np.float32),
               "model.layers.0.mlp.up_proj.weight": np.zeros((64, 32), np.int8),
               "model.layers.0.self_attn.q_proj.weight": np.zeros((32, 32), np.uint16)},
              folder / "model.safetensors")
    spec = resolve(str(folder)).spec
    got = {t.name: (t.shape, t.dtype, t.nbytes) for t in spec.tensors}
    assert got == {TOKEN_EMBD: ((10, 32), "F32", 1280),
                   "blk.0.ffn_up.weight": ((64, 32), "I8", 2048),
                   "blk.0.attn_q.weight": ((32, 32), "U16", 2048)}
    assert spec.tied_embeddings and spec.n_kv_heads == 4 and spec.head_dim == 8
