"""Synthetic models: a preset's exact shapes with random weights, written on demand.

`synthetic:<preset>[@<quant>]` answers "how fast would model X run here?" without a
download: speed depends on shapes and storage types, not on the weights' values.

Two artefacts, each written lazily into the cache (keyed by content, atomic rename):
  gguf  llama.cpp-loadable file at f32 / f16 / q8_0 / q4_0, with a synthetic tokenizer
  hf    config.json + model.safetensors (F16; F32 for @f32) — torch runs it unquantised

Writing is disk-bound by design: random *quantised blocks* are produced directly (bytes
from a random pool, block scales set to small fp16 values), never by quantising random
floats, and tensors stream to the file in chunks, so even an 8B preset never sits in RAM.

The tokenizer is built so that text round-trips exactly: id 0 <unk>, 1 <s> (BOS),
2 </s> (EOS), 3..258 the 256 byte-fallback tokens <0x00>..<0xFF>, and every later id
is one distinct CJK-and-beyond character. Text made of those characters tokenizes to one
token per character (no merges exist), so `text_for_tokens(ids)` is a prompt of exactly
len(ids) tokens (+ BOS) for HTTP servers that only take text.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from strata.errors import InputError
from strata.models.mixes import FALLBACK, FTYPE_NAMES, MIXES
from strata.models.presets import Preset, get_preset
from strata.models.source import ResolvedModel, register
from strata.models.spec import ModelSpec, TensorInfo
from strata.models.synthetic_layout import add_arch_metadata, rope_values
from strata.models.synthetic_layout import layout as _layout
from strata.models.synthetic_moe import HF_EXPERT_LAYOUTS, add_moe_metadata

# The vocabulary lives in its own module; these names stay importable from here.
from strata.models.synthetic_vocab import (  # noqa: F401
    _TOKEN_TYPE,
    FIRST_TEXT_ID,
    N_BYTE_TOKENS,
    text_for_tokens,
    text_id_range,
    text_token_capacity,
    tokens_for_text,
    vocab_tokens,
)

PREFIX = "synthetic:"
DEFAULT_QUANT = "q8_0"
# Bump when the bytes written change (layout, metadata, vocab, fill): old cache entries
# then stop matching their content key and are rewritten.
WRITER_VERSION = 1

# ---------------------------------------------------------------------------------------
# Synthetic vocabulary
# ---------------------------------------------------------------------------------------

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

# ---------------------------------------------------------------------------------------
# Storage types and random fills
# ---------------------------------------------------------------------------------------


def _fill_q8_0(raw: np.ndarray) -> None:
    # Block: fp16 scale + 32 int8. Random int8 x 1/8192 -> |w| <= 0.016, like trained weights.
    raw.reshape(-1, 34)[:, :2] = np.frombuffer(np.float16(1 / 8192).tobytes(), np.uint8)


def _fill_q4_0(raw: np.ndarray) -> None:
    # Block: fp16 scale + 16 bytes of nibbles, w = (nibble - 8) x scale -> |w| <= 0.016.
    raw.reshape(-1, 18)[:, :2] = np.frombuffer(np.float16(1 / 512).tobytes(), np.uint8)


def _fill_mxfp4(raw: np.ndarray) -> None:
    # Block: E8M0 exponent e + 16 bytes of nibbles, w = kvalue(nibble) x 2^(e-128), kvalues
    # up to ±12: e = 118 -> |w| <= 0.012.
    raw.reshape(-1, 17)[:, 0] = 118


def _fill_f16(raw: np.ndarray) -> None:
    # Keep random sign, mantissa and the exponent's low bit; force exponent 8|9:
    # |w| in [2^-7, 2^-5): finite, never NaN/Inf/denormal.
    u = raw.view(np.uint16)
    u &= np.uint16(0x87FF)
    u |= np.uint16(8 << 10)


def _fill_f32(raw: np.ndarray) -> None:
    u = raw.view(np.uint32)  # same idea: exponent 120|121 -> |w| in [2^-7, 2^-5)
    u &= np.uint32(0x80FFFFFF)
    u |= np.uint32(120 << 23)


def _ones(dtype: type[np.floating]) -> Callable[[np.ndarray], None]:
    def fill(raw: np.ndarray) -> None:
        raw.view(dtype)[:] = 1  # RMS-norm weights: ones keep activations in range

    return fill


@dataclass(frozen=True)
class Storage:
    """A GGML storage type: `block` elements take `block_bytes` bytes."""

    name: str  # GGML type name, as TensorInfo.dtype and gguf.GGMLQuantizationType use it
    block: int
    block_bytes: int
    random: Callable[[np.ndarray], None]  # turn random bytes into valid values, in place
    ones: Callable[[np.ndarray], None] | None = None

    def nbytes(self, elements: int) -> int:
        return elements // self.block * self.block_bytes


STORAGES: dict[str, Storage] = {
    "F32": Storage("F32", 1, 4, _fill_f32, _ones(np.float32)),
    "F16": Storage("F16", 1, 2, _fill_f16, _ones(np.float16)),
    "Q8_0": Storage("Q8_0", 32, 34, _fill_q8_0),
    "Q4_0": Storage("Q4_0", 32, 18, _fill_q4_0),
    "MXFP4": Storage("MXFP4", 32, 17, _fill_mxfp4),
}


@dataclass(frozen=True)
class Quant:
    """What `@<quant>` means for each artefact."""

    matrix: str  # GGUF storage of 2-D weights (embedding and head included)
    fallback: str  # for a matrix whose rows are not a whole number of blocks
    file_type: int  # llama.cpp LLAMA_FTYPE (general.file_type)
    hf: str  # safetensors storage: torch runs weights unquantised
    mix: bool = False  # a llama.cpp mix: written by llama.cpp's quantizer (synthetic_mix)


QUANTS: dict[str, Quant] = {
    "f32": Quant("F32", "F32", 0, "F32"),
    "f16": Quant("F16", "F16", 1, "F16"),
    "q8_0": Quant("Q8_0", "F16", 7, "F16"),
    "q4_0": Quant("Q4_0", "F16", 2, "F16"),
    # llama.cpp's K-quant mixes: per-tensor types by llama.cpp's rules (models/mixes.py)
    **{m.key: Quant(m.default, FALLBACK[m.default], m.ftype, "F16", mix=True)
       for m in MIXES.values() if m.default in FALLBACK},
}

# ---------------------------------------------------------------------------------------
# Tensor plans (the layout itself is synthetic_layout's, from the architecture's declaration)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorPlan:
    name: str  # GGUF name
    shape: tuple[int, ...]  # PyTorch order
    storage: Storage
    init: str  # "random", "ones" or "values" (computed: rope_freqs, written as they are)

    @property
    def elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.storage.nbytes(self.elements)

    def info(self) -> TensorInfo:
        return TensorInfo(self.name, self.shape, self.storage.name, self.nbytes)


FLOAT_TYPES = ("F32", "F16")  # quants whose experts stay float (the unquantised files)


def _arch_of(p: Preset) -> Any:
    from strata.models import arch as registry

    return registry.get(p.arch, "a synthetic preset")


def _init(role: str) -> str:
    return {"norm": "ones", "values": "values"}.get(role, "random")


def _gguf_storage(name: str, role: str, shape: tuple[int, ...], quant: Quant,
                  expert_storage: str | None) -> Storage:
    if role != "matrix":
        # norms, biases and the MoE router stay F32, as llama.cpp's converters write them
        return STORAGES["F32"]
    matrix = STORAGES[quant.matrix]
    if expert_storage and name.endswith("_exps.weight") and quant.matrix not in FLOAT_TYPES:
        matrix = STORAGES[expert_storage]  # gpt-oss's experts: MXFP4 in every quantised file
    return matrix if shape[-1] % matrix.block == 0 else STORAGES[quant.fallback]


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticModel:
    preset: Preset
    quant: str  # key of QUANTS

    @property
    def ref(self) -> str:
        return f"{PREFIX}{self.preset.name}@{self.quant}"

    def gguf_tensors(self) -> list[TensorPlan]:
        q = QUANTS[self.quant]
        experts = _arch_of(self.preset).expert_storage
        return [TensorPlan(name, shape, _gguf_storage(name, role, shape, q, experts), _init(role))
                for name, shape, role in _layout(self.preset)]

    def hf_tensors(self) -> list[TensorPlan]:
        # Experts as the architecture's transformers checkpoints store them (one tensor per
        # expert, or gpt-oss's fused gate/up)
        storage = STORAGES[QUANTS[self.quant].hf]
        experts = HF_EXPERT_LAYOUTS[_arch_of(self.preset).transformers_experts]
        # the frequency factors are the config's rope_scaling on that side, not a tensor
        return [TensorPlan(name, shape, storage, _init(role))
                for name, shape, role in experts(_layout(self.preset)) if role != "values"]

    def _spec(self, tensors: list[TensorPlan], notes: list[str]) -> ModelSpec:
        p = self.preset
        return ModelSpec(
            name=self.ref, arch=p.arch, n_layers=p.n_layers, n_heads=p.n_heads,
            n_kv_heads=p.n_kv_heads, head_dim=p.head_dim, hidden=p.hidden, ffn=p.ffn,
            vocab=p.vocab, ctx_max=p.ctx_max, tied_embeddings=p.tied_embeddings,
            tensors=[t.info() for t in tensors], source="synthetic", notes=notes,
            n_experts=p.n_experts, n_experts_used=p.n_experts_used, expert_ffn=p.expert_ffn,
            file_type=FTYPE_NAMES[QUANTS[self.quant].file_type],
            sliding_window=p.sliding_window)

    def gguf_spec(self) -> ModelSpec:
        if QUANTS[self.quant].mix:
            from strata.models.synthetic_mix import mix_spec

            return mix_spec(self)
        tensors, q = self.gguf_tensors(), QUANTS[self.quant]
        notes = [f"random weights with {self.preset.name}'s shapes ({self.preset.source})"]
        experts = _arch_of(self.preset).expert_storage
        odd = [t.name for t in tensors if len(t.shape) >= 2 and t.storage.name != q.matrix
               and t.storage.name != experts and t.storage.name != "F32"
               and not t.name.endswith("ffn_gate_inp.weight")]
        if experts and any(t.storage.name == experts for t in tensors):
            notes.append(f"routed experts stored {experts}, as the published files store them")
        if odd:
            notes.append(f"{len(odd)} matrices whose rows are not whole {q.matrix} blocks are "
                         f"stored {q.fallback} (e.g. {odd[0]})")
        return self._spec(tensors, notes)

    def hf_spec(self) -> ModelSpec:
        hf = QUANTS[self.quant].hf
        notes = [f"random weights with {self.preset.name}'s shapes ({self.preset.source})"]
        if hf != QUANTS[self.quant].matrix:
            notes.append(f"torch runs this model unquantised: safetensors holds {hf} weights, "
                         f"not {QUANTS[self.quant].matrix}")
        return self._spec(self.hf_tensors(), notes)

    # -- cache -----------------------------------------------------------------------------
    def content_key(self, fmt: str) -> str:
        """Directory name in the cache: readable prefix + hash of everything written."""
        storage = self.quant if fmt == "gguf" else QUANTS[self.quant].hf.lower()
        writer: Any = WRITER_VERSION
        if fmt == "gguf" and QUANTS[self.quant].mix:
            from strata.models.synthetic_mix import writer_tag

            writer = [WRITER_VERSION, writer_tag()]
        blob = json.dumps({"preset": self.preset.values(), "format": fmt, "storage": storage,
                           "writer": writer}, sort_keys=True)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
        return f"{self.preset.name}-{fmt}-{storage}-{digest}"

    def gguf_path(self) -> Path:
        """The GGUF file, written on first use."""
        name = f"{self.preset.name}-{self.quant}.gguf"
        if QUANTS[self.quant].mix:
            from strata.models.synthetic_mix import write_mix

            folder = _materialise(self, self.content_key("gguf"),
                                  self.gguf_spec().weight_bytes(),
                                  lambda d: write_mix(self, d / name))
            return folder / name
        size = sum(t.nbytes for t in self.gguf_tensors())
        folder = _materialise(self, self.content_key("gguf"), size,
                              lambda d: write_gguf(self, d / name))
        return folder / name

    def hf_path(self) -> Path:
        """The Hugging Face directory, written on first use."""
        size = sum(t.nbytes for t in self.hf_tensors())
        from strata.models.synthetic_hf import write_hf  # the HF writer needs this module

        return _materialise(self, self.content_key("hf"), size, lambda d: write_hf(self, d))

    def seed(self, fmt: str) -> int:
        # Deterministic bytes for a given key: the same key always means the same file.
        return int(hashlib.sha256(self.content_key(fmt).encode()).hexdigest()[:16], 16)


def models_dir() -> Path:
    from strata.paths import cache_dir

    return cache_dir() / "models"


def _materialise(model: SyntheticModel, key: str, size: int,
                 write: Callable[[Path], None]) -> Path:
    """cache/models/<key>/, written by `write` into a temp dir renamed into place.

    The rename is atomic: a reader sees a complete directory or none, and two processes
    writing the same key at once both end with the same complete result.
    """
    final = models_dir() / key
    if final.is_dir():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        _sweep_stale(final.parent)
        _check_space(model, final.parent, size)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=final.parent))
    except OSError as exc:
        raise InputError(f"{model.ref}: cannot write to the cache {final.parent}: "
                         f"{exc.strerror or exc} (set STRATA_HOME to a writable place)") from exc
    try:
        write(tmp)
        _publish(tmp, final)
    except OSError as exc:
        raise InputError(f"{model.ref}: writing {final} failed: {exc.strerror or exc} "
                         "(free disk space or set STRATA_HOME elsewhere)") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op once renamed
    return final


STALE_SECONDS = 6 * 3600


def _sweep_stale(folder: Path) -> None:
    """Remove temp dirs left by writers that were killed (no `finally` ran); any live
    writer touches its dir far more recently than this."""
    cutoff = time.time() - STALE_SECONDS
    for tmp in folder.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            if tmp.stat().st_mtime < cutoff:
                shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, final: Path) -> None:
    try:
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():  # not "another process got there first"
            raise


def _check_space(model: SyntheticModel, folder: Path, size: int) -> None:
    need = int(size * 1.02) + (64 << 20)  # + metadata (vocab) and headroom
    free = shutil.disk_usage(folder).free
    if free < need:
        raise InputError(f"{model.ref}: writing it needs {need / 1e9:.1f} GB but {folder} has "
                         f"{free / 1e9:.1f} GB free (delete {folder} or set STRATA_HOME to "
                         "a roomier disk)")


# ---------------------------------------------------------------------------------------
# Streaming random bytes
# ---------------------------------------------------------------------------------------

CHUNK_BYTES = 16 << 20


class RandomPool:
    """Random bytes at memory speed: one random pool, each chunk a copy taken at a random
    offset. Generating fresh random numbers for a 16 GB model would take minutes on a small
    CPU; values do not change speed, so a reused pool costs nothing in fidelity."""

    def __init__(self, seed: int, largest: int) -> None:
        self._rng = np.random.default_rng(seed)
        size = min(2 * CHUNK_BYTES, max(64, largest))
        size += -size % 4  # whole uint32 words
        self._pool = self._rng.integers(0, 2**32, size // 4, dtype=np.uint32).view(np.uint8)

    def take(self, n: int) -> np.ndarray:
        start = int(self._rng.integers(0, len(self._pool) - n + 1))
        return self._pool[start:start + n].copy()


def _stream_tensor(out: BinaryIO, t: TensorPlan, pool: RandomPool,
                   values: dict[str, np.ndarray] | None = None) -> None:
    """Write one tensor's bytes in chunks of whole blocks (`values`: computed F32 tensors by
    name, for init "values")."""
    if t.init == "values":
        assert values is not None and t.storage.name == "F32", t.name
        out.write(np.ascontiguousarray(values[t.name], dtype=np.float32).tobytes())
        return
    fill = t.storage.ones if t.init == "ones" else t.storage.random
    if fill is None:
        raise ValueError(f"{t.name}: {t.storage.name} cannot hold constant values")
    blocks = t.elements // t.storage.block
    per_chunk = max(1, CHUNK_BYTES // t.storage.block_bytes)
    for first in range(0, blocks, per_chunk):
        raw = pool.take(min(per_chunk, blocks - first) * t.storage.block_bytes)
        fill(raw)
        out.write(memoryview(raw))


def _pad(out: BinaryIO, alignment: int) -> None:
    out.write(b"\0" * (-out.tell() % alignment))


# ---------------------------------------------------------------------------------------
# GGUF writer
# ---------------------------------------------------------------------------------------


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError as exc:
        raise InputError("writing a GGUF needs the gguf package "
                         "(pip install gguf; it is a strata dependency)") from exc
    return gguf


def _add_gguf_metadata(w: Any, model: SyntheticModel) -> None:
    p = model.preset
    w.add_name(model.ref)
    w.add_file_type(QUANTS[model.quant].file_type)
    w.add_quantization_version(2)  # GGML_QNT_VERSION of today's Q8_0/Q4_0 block layout
    w.add_string("strata.synthetic", model.ref)  # lets readers know the vocab is synthetic
    w.add_context_length(p.ctx_max)
    w.add_embedding_length(p.hidden)
    w.add_block_count(p.n_layers)
    w.add_feed_forward_length(p.ffn)
    w.add_head_count(p.n_heads)
    w.add_head_count_kv(p.n_kv_heads)
    w.add_key_length(p.head_dim)
    w.add_value_length(p.head_dim)
    w.add_rope_dimension_count(p.head_dim)
    w.add_rope_freq_base(p.rope_theta)
    w.add_layer_norm_rms_eps(p.norm_eps)
    w.add_vocab_size(p.vocab)
    add_moe_metadata(w, p)
    add_arch_metadata(w, p)


def _add_vocab(w: Any, vocab: int, arch: str) -> None:
    texts, types, scores = vocab_tokens(vocab, arch)
    w.add_tokenizer_model("llama")  # SentencePiece-style: no merges, byte fallback
    w.add_token_list(texts)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)  # else every prompt would gain a leading "▁" token


def write_gguf(model: SyntheticModel, path: Path) -> None:
    """Write the GGUF: header, metadata and tensor infos first, then tensor data streamed
    one tensor (and one chunk) at a time."""
    gguf = _import_gguf()
    tensors = model.gguf_tensors()
    writer = gguf.GGUFWriter(path, model.preset.arch)
    try:
        _add_gguf_metadata(writer, model)
        _add_vocab(writer, model.preset.vocab, model.preset.arch)
        for t in tensors:
            # A non-uint8 dtype makes the writer take `shape` as element shape (PyTorch
            # order, it reverses it into GGUF's ne[]); raw_dtype is the stored type.
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes,
                                   raw_dtype=gguf.GGMLQuantizationType[t.storage.name])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        out = writer.fout[0]
        pool = RandomPool(model.seed("gguf"), max(t.nbytes for t in tensors))
        for t in tensors:
            # Same placement as GGUFWriter.write_tensor_data: aligned start, padded end.
            _pad(out, writer.data_alignment)
            start = out.tell()
            _stream_tensor(out, t, pool, rope_values(model.preset))
            if out.tell() - start != t.nbytes:
                raise OSError(f"{t.name}: wrote {out.tell() - start} bytes, not {t.nbytes}")
        _pad(out, writer.data_alignment)
    finally:
        writer.close()


# ---------------------------------------------------------------------------------------
# Hugging Face writer (config.json + model.safetensors)
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# Resolver
# ---------------------------------------------------------------------------------------


def parse_ref(ref: str) -> SyntheticModel:
    """`synthetic:<preset>[@<quant>]` -> SyntheticModel (InputError naming what is wrong)."""
    body = ref[len(PREFIX):]
    name, _, quant = body.partition("@")
    quant = (quant or DEFAULT_QUANT).lower()
    if quant not in QUANTS:
        raise InputError(f"MODEL {ref}: unknown quant @{quant} (choose from "
                         f"{', '.join(QUANTS)})")
    return SyntheticModel(get_preset(name, ref), quant)


@register("synthetic")
def resolve_synthetic(ref: str, model_name: str | None) -> ResolvedModel | None:
    if not ref.startswith(PREFIX):
        return None
    model = parse_ref(ref)
    return ResolvedModel(
        ref=ref, kind="synthetic", spec=model.gguf_spec(), model_name=model_name,
        artefacts={"gguf": model.gguf_path, "hf": model.hf_path},
        specs={"gguf": model.gguf_spec(), "hf": model.hf_spec()},
    )
