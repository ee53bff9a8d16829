"""strata's own block decoders (the lab's oracle side: kernels/ops/_quant.py and _kquant.py)
against gguf-py's `gguf.quants.dequantize`, the reference implementation of every GGML block
format and what the GGUF->torch loader dequantises with: equal bit for bit in float32.

Blocks from two sources: llama.cpp's own quantizer (a converter-style F16 file re-stored at
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K_M and Q5_K_M, whose rows are whole 256-value super-blocks),
and random valid bytes (every packed bit pattern, finite fp16 scales of both signs) with zero
and subnormal scales and mins planted.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) not installed")

from strata.kernels.ops import _kquant, _quant  # noqa: E402
from tests.test_gguf_torch import K_SHAPE, write_converter_gguf  # noqa: E402

KINDS = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K")
# llama.cpp LLAMA_FTYPE: 2 Q4_0, 3 Q4_1, 7 Q8_0, 8 Q5_0, 9 Q5_1, 15 Q4_K_M, 17 Q5_K_M
FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q4_k_m": 15, "q5_k_m": 17}


def ours(kind: str, w: np.ndarray, k: int) -> np.ndarray:
    """strata's float32 values of uint8 blocks `w` [rows, bytes]."""
    mod = _kquant if kind in _kquant.KINDS else _quant
    blocks = torch.from_numpy(np.ascontiguousarray(w))
    return mod.dequantize(kind, blocks, k, dtype=torch.float32).numpy()


def theirs(kind: str, w: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(w, gguf.GGMLQuantizationType[kind.upper()])


def assert_bit_equal(kind: str, w: np.ndarray, k: int, what: str) -> None:
    a, b = ours(kind, w, k), theirs(kind, w).reshape(w.shape[0], k)
    assert a.dtype == b.dtype == np.float32
    differ = a.view(np.uint32) != b.view(np.uint32)  # -0.0 vs 0.0 and NaNs count too
    assert not differ.any(), (f"{kind} ({what}): {int(differ.sum())} of {a.size} values "
                              f"differ, first at {np.argwhere(differ)[0].tolist()}")


@pytest.fixture(scope="module")
def llama_cpp_blocks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[np.ndarray]]:
    """kind -> the 2-D tensors (uint8 blocks, one row per output row) llama.cpp wrote."""
    from strata.backends.llamacpp_quantize import quantize_gguf

    tmp = tmp_path_factory.mktemp("decoders")
    src = write_converter_gguf(tmp / "f16.gguf", "F16", shape=K_SHAPE, peaked=False).path
    found: dict[str, list[np.ndarray]] = {}
    for mix, ftype in FTYPES.items():
        dst = tmp / f"{mix}.gguf"
        quantize_gguf(src, dst, ftype, threads=2)
        for t in gguf.GGUFReader(str(dst)).tensors:
            kind = t.tensor_type.name.lower().replace("_k", "_K")
            if kind in KINDS and len(t.shape) == 2:
                found.setdefault(kind, []).append(np.array(t.data))
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_decoders_equal_gguf_py_on_llama_cpps_blocks(
        kind: str, llama_cpp_blocks: dict[str, list[np.ndarray]]) -> None:
    tensors = llama_cpp_blocks.get(kind, [])
    assert tensors, f"llama.cpp's quantizer wrote no {kind} tensor"
    for w in tensors:
        k = w.shape[1] // (_kquant.BLOCK_BYTES | _quant.BLOCK_BYTES)[kind] * \
            (_kquant.QK_K if kind in _kquant.KINDS else _quant.QK)
        assert_bit_equal(kind, w, k, f"llama.cpp, {w.shape[0]} x {k}")


def _scale_offsets(kind: str) -> list[int]:
    """Byte offsets of the fp16 scales/mins in one block."""
    return {"q6_K": [208], "q4_K": [0, 2], "q5_K": [0, 2], "q4_1": [0, 2],
            "q5_1": [0, 2]}.get(kind, [0])


@pytest.mark.parametrize("kind", KINDS)
def test_decoders_equal_gguf_py_on_random_blocks_with_zero_and_subnormal_scales(
        kind: str) -> None:
    mod = _kquant if kind in _kquant.KINDS else _quant
    rows, k = 6, 1024
    w = mod.random_blocks(kind, rows, k, seed=5).numpy().copy()
    size = mod.BLOCK_BYTES[kind]
    blocks = w.reshape(-1, size)
    planted = {"zero": np.float16(0.0), "negative zero": np.float16(-0.0),
               "smallest subnormal": np.float16(2.0 ** -24),
               "largest subnormal": np.float16(-(2.0 ** -14 - 2.0 ** -24)),
               "large": np.float16(-60000.0)}
    for i, value in enumerate(planted.values()):  # one block per planted scale, per field
        for j, at in enumerate(_scale_offsets(kind)):
            blocks[2 * i + j, at:at + 2] = np.frombuffer(value.tobytes(), np.uint8)
    scales = np.concatenate([blocks[:, at:at + 2].copy().view(np.float16)
                             for at in _scale_offsets(kind)])
    assert np.isfinite(scales).all()  # valid blocks: random bytes could be NaN/inf scales
    assert (scales == 0).any() and ((scales != 0) & (np.abs(scales) < 2.0 ** -14)).any()
    assert_bit_equal(kind, w, k, "random bytes")
