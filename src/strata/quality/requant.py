"""Re-quantise a GGUF: the same tensors, names and metadata at another storage type.

KL divergence only means something between the same weights at two precisions. llama.cpp's
`llama-quantize` makes those for real models; this makes them from any f32/f16 GGUF with
gguf-py's reference quantisers (Q8_0 and Q4_0 blocks bit-compatible with llama.cpp), so the
tests (and anyone without a llama.cpp build) get like-for-like pairs. Every tensor is
dequantised to float32 first, optionally transformed, then stored: 2-D matrices at the
target type (F16 when a row is not whole blocks, as llama.cpp's converters do), norms and
biases at F32.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from strata.errors import InputError

Transform = Callable[[str, np.ndarray], np.ndarray]  # (tensor name, float32 values) -> values


@dataclass(frozen=True)
class Target:
    matrix: str  # GGMLQuantizationType name for 2-D weights
    file_type: int  # llama.cpp LLAMA_FTYPE for general.file_type


TARGETS: dict[str, Target] = {
    "f32": Target("F32", 0),
    "f16": Target("F16", 1),
    "q8_0": Target("Q8_0", 7),
    "q4_0": Target("Q4_0", 2),
}
# Keys the writer sets itself, or that would lie about the new file.
_SKIP_KEYS = ("general.architecture", "general.alignment", "general.file_type")


def _gguf() -> Any:
    import gguf

    return gguf


def _copy_metadata(reader: Any, writer: Any) -> None:
    gguf = _gguf()
    for f in reader.fields.values():
        if f.name in _SKIP_KEYS or f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), vtype, sub_type=sub)


def _storage(values: np.ndarray, target: Target) -> Any:
    gguf = _gguf()
    if values.ndim < 2:
        return gguf.GGMLQuantizationType.F32  # norms, biases: tiny, and precision-critical
    qtype = gguf.GGMLQuantizationType[target.matrix]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return qtype if values.shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16


def requantize_gguf(src: Path, dst: Path, quant: str,
                    transform: Transform | None = None) -> Path:
    """Write `src` re-quantised to `quant` (f32, f16, q8_0, q4_0) at `dst`, atomically."""
    if quant not in TARGETS:
        raise InputError(f"quant {quant}: choose one of {', '.join(TARGETS)}")
    gguf = _gguf()
    target = TARGETS[quant]
    try:
        reader = gguf.GGUFReader(str(src))
    except (OSError, ValueError, IndexError) as exc:  # gguf-py's errors on damaged headers
        raise InputError(f"{src}: cannot read it as GGUF ({exc})") from None
    arch = reader.fields["general.architecture"].contents()
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        _copy_metadata(reader, writer)
        writer.add_file_type(target.file_type)
        for t in reader.tensors:
            values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            if transform is not None:
                values = transform(t.name, values).astype(np.float32)
            qtype = _storage(values, target)
            writer.add_tensor(t.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, dst)
    return dst
