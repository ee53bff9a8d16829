"""GGUF source: exact specs from real files, and one-line InputErrors for damaged ones.

Damaged files are real files: a valid GGUF from the synthetic writer, then truncated or
patched at the byte offsets the GGUF format defines.
"""

from __future__ import annotations

import shutil
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from strata.errors import InputError
from strata.models.gguf import ArrayInfo, read_spec, scan
from strata.models.source import resolve
from strata.models.spec import OUTPUT

gguf = pytest.importorskip("gguf")

N_TENSORS_AT, N_KV_AT, FIRST_KEY_AT = 8, 16, 24  # GGUF v3 header layout
HUGE = 2**60


@pytest.fixture
def tiny(strata_home: Path, tmp_path: Path) -> Path:
    """A private copy of a valid tiny GGUF (untied llama, Q8_0)."""
    src = resolve("synthetic:tiny@q8_0").path("gguf", "llamacpp")
    dst = tmp_path / "tiny.gguf"
    shutil.copyfile(src, dst)
    return dst


def _patch(path: Path, offset: int, fmt: str, value: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(fmt, value))


def _offset_after(path: Path, marker: bytes) -> int:
    data = path.read_bytes()
    pos = data.find(marker)
    assert pos > 0, marker
    return pos + len(marker)


def _input_error(path: Path) -> str:
    """Resolve a damaged file: must be an InputError, one line, naming the file; bounded
    memory (never more than the file's size) even when the header claims 2^60."""
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as err:
            resolve(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg
    assert peak < max(4 * path.stat().st_size, 8 << 20), peak
    return msg


# -- valid files ------------------------------------------------------------------------------


@pytest.mark.parametrize("ref", ["synthetic:tiny@q8_0", "synthetic:tiny-qwen2@q4_0",
                                 "synthetic:tiny@f16", "synthetic:smollm2-135m@q8_0"])
def test_spec_is_exact(strata_home: Path, ref: str) -> None:
    synthetic = resolve(ref)
    path = synthetic.path("gguf", "llamacpp")
    model = resolve(str(path))
    assert model.kind == "gguf" and model.path("gguf", "llamacpp") == path
    spec, want = model.spec, synthetic.spec
    assert spec.tensors == want.tensors
    for field in ("arch", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden", "ffn",
                  "vocab", "ctx_max", "tied_embeddings"):
        assert getattr(spec, field) == getattr(want, field), field
    assert spec.name == ref and spec.source == "gguf"
    assert spec.tied_embeddings == (spec.tensor(OUTPUT) is None)


def test_reader_agrees_with_gguf_package(tiny: Path) -> None:
    """The bounds-checked reader decodes what gguf.GGUFReader decodes."""
    layout, sizes = scan(tiny)
    reader = gguf.GGUFReader(tiny)
    assert layout.data_offset == reader.data_offset
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        ours = layout.kv[name]
        if isinstance(ours, ArrayInfo):
            assert ours.length == len(field.data)
        elif isinstance(ours, list):
            assert ours == field.contents()
        elif isinstance(ours, float):
            assert ours == pytest.approx(field.contents())
        else:
            assert ours == field.contents(), name
    assert [(t.name, s.nbytes, s.type_name) for t, s in zip(layout.tensors, sizes, strict=True)] \
        == [(t.name, int(t.n_bytes), t.tensor_type.name) for t in reader.tensors]
    assert [t.data_offset for t in reader.tensors] == [
        layout.data_offset + t.offset for t in layout.tensors]


def test_file_with_magic_but_other_suffix_resolves(tiny: Path) -> None:
    other = tiny.with_name("model.bin")
    tiny.rename(other)
    assert resolve(str(other)).kind == "gguf"


def test_split_gguf_reads_every_shard(tmp_path: Path) -> None:
    first = _write_split(tmp_path / "m.gguf", n_tensors=5, per_shard=2)
    assert first.name == "m-00001-of-00003.gguf"
    spec = read_spec(first)
    assert [t.name for t in spec.tensors] == [f"blk.{i}.ffn_up.weight" for i in range(5)]
    assert all(t.nbytes == 32 * 16 * 4 for t in spec.tensors)
    first.with_name("m-00003-of-00003.gguf").unlink()
    with pytest.raises(InputError, match=r"shard m-00003-of-00003\.gguf .* missing"):
        read_spec(first)


def _write_split(path: Path, n_tensors: int, per_shard: int) -> Path:
    w = gguf.GGUFWriter(path, "llama", split_max_tensors=per_shard)
    _minimal_llama_kv(w)
    for i in range(n_tensors):
        w.add_tensor(f"blk.{i}.ffn_up.weight", np.ones((16, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.with_name(f"{path.stem}-00001-of-{-(-n_tensors // per_shard):05d}.gguf")


def _minimal_llama_kv(w: object, skip: str = "") -> None:
    for key, value in {"llama.block_count": 1, "llama.embedding_length": 32,
                       "llama.attention.head_count": 2}.items():
        if key != skip:
            w.add_uint32(key, value)


# -- damaged files ----------------------------------------------------------------------------


def test_truncated_file(tiny: Path) -> None:
    size = tiny.stat().st_size
    with open(tiny, "r+b") as f:
        f.truncate(size - 1000)
    msg = _input_error(tiny)
    assert "truncated" in msg and "output.weight" in msg


def test_truncated_inside_header(tiny: Path) -> None:
    with open(tiny, "r+b") as f:
        f.truncate(3000)
    assert "truncated" in _input_error(tiny)


@pytest.mark.parametrize("size", [0, 3, 20])
def test_tiny_fragments(tiny: Path, size: int) -> None:
    with open(tiny, "r+b") as f:
        f.truncate(size)
    _input_error(tiny)


def test_bad_magic(tiny: Path) -> None:
    _patch(tiny, 0, "<4s", b"GGUX")  # type: ignore[arg-type]
    assert "bad magic" in _input_error(tiny)


def test_unsupported_version(tiny: Path) -> None:
    _patch(tiny, 4, "<I", 99)
    assert "version 99" in _input_error(tiny)


@pytest.mark.parametrize(("offset", "what"), [(N_TENSORS_AT, "tensors"),
                                              (N_KV_AT, "metadata entries")])
def test_absurd_counts(tiny: Path, offset: int, what: str) -> None:
    _patch(tiny, offset, "<Q", HUGE)
    msg = _input_error(tiny)
    assert f"claims {HUGE} {what}" in msg and "absurd" in msg


def test_absurd_key_length(tiny: Path) -> None:
    _patch(tiny, FIRST_KEY_AT, "<Q", HUGE)
    msg = _input_error(tiny)
    assert f"needs {HUGE} bytes" in msg and "metadata key #0" in msg


def test_absurd_string_value_length(tiny: Path) -> None:
    # general.architecture's value: key, then u32 type (8 = string), then u64 length
    at = _offset_after(tiny, b"general.architecture") + 4
    _patch(tiny, at, "<Q", HUGE)
    assert "general.architecture" in _input_error(tiny)


def test_absurd_array_length(tiny: Path) -> None:
    # tokenizer.ggml.tokens: key, u32 type (9 = array), u32 item type, u64 length
    at = _offset_after(tiny, b"tokenizer.ggml.tokens") + 8
    _patch(tiny, at, "<Q", HUGE)
    msg = _input_error(tiny)
    assert "tokenizer.ggml.tokens" in msg and str(HUGE) in msg


def test_array_longer_than_the_file(tiny: Path) -> None:
    at = _offset_after(tiny, b"tokenizer.ggml.scores") + 8
    _patch(tiny, at, "<Q", 1 << 22)  # under the element limit, over the file's bytes
    assert "tokenizer.ggml.scores" in _input_error(tiny)


def test_unknown_tensor_type(tiny: Path) -> None:
    # tensor info: name, u32 n_dims (2), 2 x u64 dims, u32 type, u64 offset
    at = _offset_after(tiny, b"token_embd.weight") + 4 + 16
    _patch(tiny, at, "<I", 9999)
    assert "unknown GGML type 9999" in _input_error(tiny)


def test_tensor_offset_that_lies(tiny: Path) -> None:
    at = _offset_after(tiny, b"blk.0.attn_k.weight") + 4 + 16 + 4
    _patch(tiny, at, "<Q", 12345 * 32)
    assert "blk.0.attn_k.weight" in _input_error(tiny)


def test_absurd_dimension(tiny: Path) -> None:
    at = _offset_after(tiny, b"blk.1.ffn_up.weight") + 4 + 8
    _patch(tiny, at, "<Q", HUGE)
    msg = _input_error(tiny)
    assert "blk.1.ffn_up.weight" in msg and "absurd" in msg


@pytest.mark.parametrize("missing", ["llama.block_count", "llama.embedding_length",
                                     "llama.attention.head_count"])
def test_missing_required_key(tmp_path: Path, missing: str) -> None:
    path = tmp_path / "nokey.gguf"
    w = gguf.GGUFWriter(path, "llama")
    _minimal_llama_kv(w, skip=missing)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert f"lacks {missing}" in _input_error(path)


def test_missing_architecture(tmp_path: Path) -> None:
    path = tmp_path / "noarch.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.kv_data[0].pop("general.architecture")  # the writer adds it unasked
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    assert "general.architecture" in _input_error(path)


def test_missing_file() -> None:
    with pytest.raises(InputError, match="no such GGUF file"):
        resolve("/nonexistent/model.gguf")
