"""GGUF files: metadata and tensor infos -> ModelSpec, with exact per-tensor bytes.

A GGUF header is untrusted input: its counts and lengths decide how much to read. So the
whole header is walked here with every count and length checked against the bytes the
file actually has *before* it is used (what llama.cpp's own gguf.cpp does), nothing is
allocated beyond the file's size, and every failure becomes one InputError line naming the
file and what is wrong. Only then is the metadata decoded (gguf.GGUFReader decodes the
same file the same way; the tests hold this reader to it).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.errors import InputError
from strata.models.source import ResolvedModel, register
from strata.models.spec import OUTPUT, TOKEN_EMBD, ModelSpec, TensorInfo

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
# Arrays longer than this are not metadata any real model carries (vocabularies are
# ~10^5); refusing them bounds the work a hostile header can ask for.
MAX_ARRAY = 1 << 24
SMALL_ARRAY = 4096  # numeric arrays up to this length are decoded
_MIN_KV_BYTES = 8 + 4  # key length + value type
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset

# GGUF value types -> struct format of one element (string=8 and array=9 are handled apart)
_SCALARS: dict[int, str] = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
                            7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY, _UINT32 = 8, 9, 4


class Damaged(Exception):
    """The file is not a well-formed GGUF; the message says where and why."""


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array, not decoded (vocabularies are large and never needed here)."""

    item_type: int
    length: int


@dataclass(frozen=True)
class RawTensor:
    name: str
    ne: tuple[int, ...]  # GGUF order (fastest-varying first)
    type_id: int
    offset: int  # relative to the data section


@dataclass
class Layout:
    """A validated GGUF header."""

    version: int
    kv: dict[str, Any] = field(default_factory=dict)  # scalars, strings, lists, ArrayInfo
    kv_types: dict[str, int] = field(default_factory=dict)  # GGUF value type of each key
    tensors: list[RawTensor] = field(default_factory=list)
    alignment: int = DEFAULT_ALIGNMENT
    data_offset: int = 0
    file_size: int = 0


# ---------------------------------------------------------------------------------------
# Bounds-checked reading
# ---------------------------------------------------------------------------------------


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, size: int) -> None:
        self.buf, self.size, self.pos = buf, size, 0

    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> int:
        """Advance over n bytes, refusing to go past the end of the file."""
        if n < 0 or n > self.remaining():
            raise Damaged(f"{what} at offset {self.pos} needs {n} bytes but the file ends "
                          f"{self.remaining()} bytes later (truncated or corrupted)")
        start = self.pos
        self.pos += n
        return start

    def unpack(self, fmt: str, what: str) -> Any:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, start)[0]

    def string(self, what: str) -> str:
        n = self.unpack("<Q", f"length of {what}")
        start = self.take(n, what)
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Damaged(f"{what} at offset {start} is not UTF-8") from exc

    def skip_string(self, what: str) -> None:
        self.take(self.unpack("<Q", f"length of {what}"), what)


def _value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype in _SCALARS:
        return cur.unpack(_SCALARS[vtype], f"value of {key}")
    if vtype == _STRING:
        return cur.string(f"string value of {key}")
    if vtype == _ARRAY:
        return _array(cur, key)
    raise Damaged(f"metadata key {key!r} has unknown value type {vtype}")


def _array(cur: _Cursor, key: str) -> ArrayInfo | list[Any]:
    item_type = cur.unpack("<I", f"array type of {key}")
    length = cur.unpack("<Q", f"array length of {key}")
    if length > MAX_ARRAY:
        raise Damaged(f"metadata array {key!r} claims {length} elements (absurd; limit "
                      f"{MAX_ARRAY})")
    if item_type in _SCALARS:
        fmt = _SCALARS[item_type]
        start = cur.take(length * struct.calcsize(fmt), f"array {key!r} of {length} elements")
        if length <= SMALL_ARRAY:  # per-layer values (head counts...): worth decoding
            return list(struct.unpack_from(f"<{length}{fmt[1]}", cur.buf, start))
    elif item_type == _STRING:
        if length * 8 > cur.remaining():  # each string has at least its 8-byte length
            raise Damaged(f"metadata array {key!r} claims {length} strings but only "
                          f"{cur.remaining()} bytes remain (truncated or corrupted)")
        for i in range(length):
            cur.skip_string(f"element {i} of {key!r}")
    else:
        raise Damaged(f"metadata array {key!r} has unsupported element type {item_type}")
    return ArrayInfo(item_type, length)


def _count(cur: _Cursor, what: str, min_bytes: int) -> int:
    n = cur.unpack("<Q", f"{what} count")
    if n * min_bytes > cur.remaining():
        raise Damaged(f"header claims {n} {what} but the whole file is {cur.size} bytes "
                      "(absurd size: corrupted header)")
    return n


def _read_kv(cur: _Cursor, layout: Layout, n_kv: int) -> None:
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        if key in layout.kv:
            raise Damaged(f"duplicate metadata key {key!r}")
        vtype = cur.unpack("<I", f"value type of {key}")
        layout.kv[key] = _value(cur, vtype, key)
        layout.kv_types[key] = vtype


def _read_tensor_info(cur: _Cursor, i: int) -> RawTensor:
    name = cur.string(f"name of tensor #{i}")
    n_dims = cur.unpack("<I", f"dimension count of {name}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise Damaged(f"tensor {name!r} claims {n_dims} dimensions (GGUF allows 1..{MAX_DIMS})")
    ne = tuple(cur.unpack("<Q", f"dimension {d} of {name}") for d in range(n_dims))
    type_id = cur.unpack("<I", f"type of {name}")
    offset = cur.unpack("<Q", f"data offset of {name}")
    return RawTensor(name, ne, type_id, offset)


def _alignment(layout: Layout) -> int:
    align = layout.kv.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in layout.kv and layout.kv_types["general.alignment"] != _UINT32:
        raise Damaged("general.alignment must be a uint32")
    if align <= 0 or align & (align - 1):
        raise Damaged(f"general.alignment {align} is not a power of two")
    return align


# ---------------------------------------------------------------------------------------
# Tensor sizes (the gguf package knows every GGML type's block size)
# ---------------------------------------------------------------------------------------


def _ggml_types() -> tuple[Any, dict[Any, tuple[int, int]]]:
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    except ImportError as exc:
        raise InputError("reading a GGUF needs the gguf package "
                         "(pip install gguf; it is a strata dependency)") from exc
    return GGMLQuantizationType, GGML_QUANT_SIZES


@dataclass(frozen=True)
class TensorSize:
    type_name: str
    nbytes: int


def tensor_size(t: RawTensor) -> TensorSize:
    """Exact stored bytes of one tensor; Damaged for an unknown type or impossible shape."""
    types, sizes = _ggml_types()
    try:
        gtype = types(t.type_id)
        block, type_bytes = sizes[gtype]
    except (ValueError, KeyError) as exc:
        raise Damaged(f"tensor {t.name!r} has unknown GGML type {t.type_id}") from exc
    if any(d == 0 or d >= 1 << 62 for d in t.ne):
        raise Damaged(f"tensor {t.name!r} has an impossible shape {t.ne}")
    if t.ne[0] % block:
        raise Damaged(f"tensor {t.name!r}: row of {t.ne[0]} is not a whole number of "
                      f"{gtype.name} blocks of {block}")
    elements = 1
    for d in t.ne:
        elements *= d
    return TensorSize(gtype.name, elements // block * type_bytes)


def _check_data(layout: Layout) -> list[TensorSize]:
    """Tensors must sit back to back (aligned) and end inside the file, as llama.cpp demands."""
    sizes, expected = [], 0
    for t in layout.tensors:
        size = tensor_size(t)
        if size.nbytes > layout.file_size:
            raise Damaged(f"tensor {t.name!r} claims dimensions {t.ne} = {size.nbytes} bytes, "
                          f"more than the whole {layout.file_size}-byte file (absurd size)")
        if t.offset != expected:
            raise Damaged(f"tensor {t.name!r} claims data offset {t.offset}, expected {expected}")
        end = layout.data_offset + t.offset + size.nbytes
        if end > layout.file_size:
            raise Damaged(f"tensor {t.name!r} ends at byte {end} but the file has "
                          f"{layout.file_size} bytes (truncated: download it again)")
        expected += size.nbytes + (-size.nbytes % layout.alignment)
        sizes.append(size)
    return sizes


# ---------------------------------------------------------------------------------------
# Reading a file
# ---------------------------------------------------------------------------------------


@contextmanager
def _mapped(path: Path) -> Iterator[tuple[mmap.mmap | bytes, int]]:
    """The file's bytes without reading them (mmap); a zero-length file maps to b""."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            yield b"", 0
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            yield buf, size


def _read_header(cur: _Cursor) -> Layout:
    if cur.size == 0:
        raise Damaged("the file is empty")
    magic = bytes(cur.buf[cur.take(4, "magic"):4])
    if magic != MAGIC:
        raise Damaged(f"bad magic {magic!r} (a GGUF file starts with b'GGUF')")
    version = cur.unpack("<I", "version")
    if version not in VERSIONS:
        raise Damaged(f"GGUF version {version} is not supported (only {VERSIONS}; a "
                      "big-endian or GGUF v1 file needs re-converting)")
    n_tensors = _count(cur, "tensors", _MIN_TENSOR_INFO_BYTES)
    n_kv = _count(cur, "metadata entries", _MIN_KV_BYTES)
    layout = Layout(version=version, file_size=cur.size)
    _read_kv(cur, layout, n_kv)
    layout.tensors = [_read_tensor_info(cur, i) for i in range(n_tensors)]
    return layout


def scan(path: Path) -> tuple[Layout, list[TensorSize]]:
    """Walk and validate the whole header and the data extents; Damaged if malformed."""
    with _mapped(path) as (buf, size):
        cur = _Cursor(buf, size)
        layout = _read_header(cur)
        end_of_infos = cur.pos
    names = [t.name for t in layout.tensors]
    if len(set(names)) != len(names):
        raise Damaged("duplicate tensor names")
    layout.alignment = _alignment(layout)
    layout.data_offset = end_of_infos + (-end_of_infos % layout.alignment)
    return layout, _check_data(layout)


def scan_or_input_error(path: Path) -> tuple[Layout, list[TensorSize]]:
    try:
        return scan(path)
    except Damaged as exc:
        raise InputError(f"MODEL {path}: damaged GGUF: {exc}; re-download or re-convert "
                         "it") from exc
    except OSError as exc:
        raise InputError(f"MODEL {path}: cannot read it: {exc.strerror or exc}") from exc


# ---------------------------------------------------------------------------------------
# Split files (model-00001-of-00003.gguf): llama.cpp loads the set from the first shard
# ---------------------------------------------------------------------------------------

_SPLIT_COUNT = "split.count"


def shard_paths(path: Path, count: int) -> list[Path]:
    """Sibling shard names, llama.cpp's pattern: <prefix>-%05d-of-%05d.gguf."""
    stem = path.name
    tail = f"-of-{count:05d}.gguf"
    if not (stem.endswith(tail) and len(stem) > len(tail) + 6 and stem[-len(tail) - 6] == "-"):
        raise InputError(f"MODEL {path}: GGUF says it is split in {count} files but its name "
                         "does not follow <name>-00001-of-0000N.gguf")
    prefix = stem[: -len(tail) - 6]
    return [path.with_name(f"{prefix}-{i:05d}{tail}") for i in range(1, count + 1)]


@dataclass(frozen=True)
class Shard:
    """One file of a (possibly split) GGUF with its validated header."""

    path: Path
    layout: Layout
    sizes: list[TensorSize]


def shards(path: Path, layout: Layout, sizes: list[TensorSize]) -> list[Shard]:
    """Every file of the model `path` starts, each validated (one Shard when not split)."""
    count = layout.kv.get(_SPLIT_COUNT, 1)
    if not isinstance(count, int) or count <= 1:
        return [Shard(path, layout, sizes)]
    out = []
    for shard in shard_paths(path, count):
        if not shard.is_file():
            raise InputError(f"MODEL {path}: shard {shard.name} of the split GGUF is missing "
                             "(download every part into the same folder)")
        out.append(Shard(path, layout, sizes) if shard == path
                   else Shard(shard, *scan_or_input_error(shard)))
    return out


def _all_tensors(path: Path, layout: Layout, sizes: list[TensorSize]
                 ) -> list[tuple[RawTensor, TensorSize]]:
    return [pair for s in shards(path, layout, sizes)
            for pair in zip(s.layout.tensors, s.sizes, strict=True)]


def read_tensor_bytes(shard: Shard, index: int) -> Any:
    """The stored bytes of tensor `index` of a scanned shard, as a uint8 numpy array.

    scan() has already checked that every tensor lies inside the file; the read is checked
    again here, because the file may have changed (or shrunk) since it was scanned.
    """
    import numpy as np

    t, size = shard.layout.tensors[index], shard.sizes[index]
    start = shard.layout.data_offset + t.offset
    try:
        with open(shard.path, "rb") as f:
            f.seek(start)
            raw = f.read(size.nbytes)
    except OSError as exc:
        raise InputError(f"MODEL {shard.path}: cannot read tensor {t.name!r}: "
                         f"{exc.strerror or exc}") from exc
    if len(raw) != size.nbytes:
        raise InputError(f"MODEL {shard.path}: tensor {t.name!r} ends past the end of the file "
                         "(it changed since it was opened, or is truncated)")
    return np.frombuffer(raw, dtype=np.uint8)


# ---------------------------------------------------------------------------------------
# ModelSpec
# ---------------------------------------------------------------------------------------


class _Meta:
    """Typed access to "<arch>.*" metadata, with one-line errors naming file and key."""

    def __init__(self, path: Path, kv: dict[str, Any], arch: str) -> None:
        self.path, self.kv, self.arch = path, kv, arch

    def count(self, key: str, default: int | None = None) -> int:
        full = f"{self.arch}.{key}"
        value = self.kv.get(full, default)
        if isinstance(value, list):  # per-layer values: the largest layer sets the cost
            value = max(value, default=None)
        if value is None:
            raise InputError(f"MODEL {self.path}: GGUF metadata lacks {full} (a damaged "
                             "conversion, or not a language model)")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"MODEL {self.path}: GGUF metadata {full} = {value!r} is not a "
                             "non-negative integer")
        return value


def _architecture(path: Path, kv: dict[str, Any]) -> str:
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InputError(f"MODEL {path}: GGUF metadata lacks general.architecture (not a "
                         "model file llama.cpp can load)")
    return arch


def _vocab(meta: _Meta, tensors: list[TensorInfo]) -> int:
    tokens = meta.kv.get("tokenizer.ggml.tokens")
    embd = next((t for t in tensors if t.name == TOKEN_EMBD), None)
    fallback = (tokens.length if isinstance(tokens, ArrayInfo)
                else embd.shape[0] if embd is not None else 0)
    return meta.count("vocab_size", fallback)


def _moe(meta: _Meta, tensors: list[TensorInfo], ffn: int) -> dict[str, int]:
    """n_experts, n_experts_used and expert_ffn (all 0 for a dense model). One expert's
    FFN width: {arch}.expert_feed_forward_length, else the merged expert tensors' shape
    (Mixtral's GGUFs carry no such key: their experts are feed_forward_length wide)."""
    n = meta.count("expert_count", 0)
    if n == 0:
        return {}
    used = meta.count("expert_used_count", 0)
    if used == 0 or used > n:
        raise InputError(f"MODEL {meta.path}: GGUF metadata {meta.arch}.expert_used_count = "
                         f"{used} with {n} experts (llama.cpp needs 1..expert_count)")
    width = meta.count("expert_feed_forward_length", 0)
    if width == 0:
        up = next((t for t in tensors if t.name.endswith(".ffn_up_exps.weight")), None)
        width = up.shape[-2] if up is not None and len(up.shape) == 3 else ffn
    return {"n_experts": n, "n_experts_used": used, "expert_ffn": width}


def spec_from_layout(path: Path, layout: Layout,
                     pairs: list[tuple[RawTensor, TensorSize]]) -> ModelSpec:
    kv = layout.kv
    meta = _Meta(path, kv, _architecture(path, kv))
    tensors = [TensorInfo(t.name, tuple(reversed(t.ne)), s.type_name, s.nbytes)
               for t, s in pairs]
    hidden, n_heads = meta.count("embedding_length"), meta.count("attention.head_count")
    if n_heads == 0:
        kind = "a recurrent (state-space) model" if any(k.startswith(f"{meta.arch}.ssm.")
                                                         for k in kv) else "no attention"
        raise InputError(f"MODEL {path}: {meta.arch} has no attention heads ({kind}): strata "
                         "sizes and runs attention models only; llama.cpp runs it "
                         "(strata bench MODEL --backend llamacpp)")
    notes = []
    ffn = meta.count("feed_forward_length", 0)
    if ffn == 0:
        notes.append(f"no {meta.arch}.feed_forward_length in the metadata")
    name = kv.get("general.name")
    return ModelSpec(
        name=name if isinstance(name, str) and name else path.stem, arch=meta.arch,
        n_layers=meta.count("block_count"), n_heads=n_heads,
        n_kv_heads=meta.count("attention.head_count_kv", n_heads),
        head_dim=meta.count("attention.key_length", hidden // n_heads),
        hidden=hidden, ffn=ffn, vocab=_vocab(meta, tensors),
        ctx_max=meta.count("context_length", 0),
        tied_embeddings=not any(t.name == OUTPUT for t in tensors),
        tensors=tensors, source="gguf", notes=notes, **_moe(meta, tensors, ffn),
        file_type=_file_type(kv.get("general.file_type")),
        sliding_window=meta.count("attention.sliding_window", 0),
    )


def _file_type(value: object) -> str | None:
    from strata.models.mixes import file_type_name

    return file_type_name(value) if isinstance(value, int) else None


def read_spec(path: Path) -> ModelSpec:
    """ModelSpec of a GGUF file (InputError with one line if it is damaged)."""
    layout, sizes = scan_or_input_error(path)
    return spec_from_layout(path, layout, _all_tensors(path, layout, sizes))


def has_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def _is_gguf_ref(path: Path) -> bool:
    if path.is_dir():
        return False
    return path.suffix.lower() == ".gguf" or (path.is_file() and has_gguf_magic(path))


@register("gguf")
def resolve_gguf(ref: str, model_name: str | None) -> ResolvedModel | None:
    path = Path(ref).expanduser()
    if not _is_gguf_ref(path):
        return None
    if not path.is_file():
        raise InputError(f"MODEL {ref}: no such GGUF file")
    return ResolvedModel(ref=ref, kind="gguf", spec=read_spec(path), model_name=model_name,
                         artefacts={"gguf": path})
