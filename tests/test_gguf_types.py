"""GGUF storage types beyond the ones strata's own kernels read, as `-B torch` and `-B lab`
meet them (issue "Real files" §Bad input).

The torch loader dequantises with gguf-py (`gguf.quants.dequantize`). Where gguf-py reads a
type, the torch loader may legitimately run it: checked here per type against llama.cpp's own
logits on a file llama.cpp's quantizer wrote (TQ1_0 and IQ4_XS: measured max |torch -
llama.cpp| 1.7e-6 and 1.4e-6 with ggml's q8_K activation rounding, 6e-2 / 5e-2 without: the
values are llama.cpp's, not garbage). Where gguf-py cannot (Q1_0 in gguf 0.19), the loader
refuses by tensor, type and backend. The lab refuses every type it has no kernel for. A file
whose block data is cut short is one line either way. Every refusal: one line, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) not installed")

from strata.backends.torch_backend import TorchBackend  # noqa: E402
from strata.models.gguf_torch import hf_name  # noqa: E402
from strata.models.source import resolve  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.seed_host import seed_host  # noqa: E402
from tests.test_gguf_torch import (  # noqa: E402
    F32,
    K_SHAPE,
    LOGIT_ATOL,
    VEC_DOT,
    bpe_vocab,
    ggml_rounding_per_type,
    llama_cpp_logits,
    sample_ids,
    write_converter_gguf,
)

# type -> the llama.cpp LLAMA_FTYPE whose quantizer writes it for most matrices (both dot
# with q8_K activations: tests/test_gguf_torch.py VEC_DOT)
GGUF_PY_READS = {"TQ1_0": 36, "IQ4_XS": 30}
BENCH = ("-p", "8", "-n", "2", "-r", "1")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An F16 converter file (every row whole 256-value super-blocks), llama.cpp's TQ1_0 and
    IQ4_XS of it, one with a Q1_0 matrix (gguf-py has no Q1_0 decoder) and one cut short
    inside the tensor data."""
    from strata.backends.llamacpp_quantize import quantize_gguf

    tmp = tmp_path_factory.mktemp("types")
    src = write_converter_gguf(tmp / "f16.gguf", "F16", shape=K_SHAPE, peaked=False).path
    out = {"F16": src}
    for kind, ftype in GGUF_PY_READS.items():
        out[kind] = tmp / f"{kind.lower()}.gguf"
        quantize_gguf(src, out[kind], ftype, threads=2)
    q1 = gguf.GGMLQuantizationType.Q1_0
    block, size = gguf.constants.GGML_QUANT_SIZES[q1]
    blocks = np.zeros((K_SHAPE.hidden, K_SHAPE.hidden // block * size), np.uint8)
    out["Q1_0"] = write_converter_gguf(tmp / "q1_0.gguf", "F16", shape=K_SHAPE,
                                       raw={"blk.0.attn_q.weight": (blocks, q1)}).path
    data = src.read_bytes()
    out["cut"] = tmp / "cut.gguf"
    out["cut"].write_bytes(data[: len(data) // 2])  # half way through the tensor data
    return out


@pytest.fixture
def home(tmp_path: Path) -> Path:
    seed_host(tmp_path / "home")
    return tmp_path / "home"


def _one_line(proc: object) -> str:
    err = proc.stderr.strip()  # type: ignore[attr-defined]
    assert proc.returncode == 2, err  # type: ignore[attr-defined]
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("kind", list(GGUF_PY_READS))
def test_types_gguf_py_reads_run_on_torch_with_llama_cpps_values(
        kind: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = files[kind]
    types = {hf_name(path, t.name): t.tensor_type.name
             for t in gguf.GGUFReader(str(path)).tensors}
    assert kind in types.values() and kind in VEC_DOT, types
    ids = sample_ids(bpe_vocab(), 48)
    backend = TorchBackend()
    backend.load(resolve(str(path)), F32)
    try:
        ours = backend.logits(ids, 0)
        hooks = ggml_rounding_per_type(backend.model, types)
        rounded = backend.logits(ids, 0)
        for h in hooks:
            h.remove()  # type: ignore[attr-defined]
    finally:
        backend.close()
    theirs = llama_cpp_logits(path, ids)
    diff, as_is = np.abs(rounded - theirs).max(), np.abs(ours - theirs).max()
    with capsys.disabled():
        print(f"\n{kind} on torch (gguf-py's dequantisation): max |torch - llama.cpp| "
              f"{diff:.1e} with ggml's q8_K rounding, {as_is:.1e} without")
    assert theirs.std() > 0.5
    assert diff <= LOGIT_ATOL < as_is  # llama.cpp's values: only the activations' rounding


@pytest.mark.parametrize(("kind", "backend", "command"), [
    ("Q1_0", "torch", "bench"), ("Q1_0", "torch", "quality"),
    ("TQ1_0", "lab", "bench"), ("IQ4_XS", "lab", "bench")])
def test_a_type_the_backend_cannot_read_is_one_line_naming_tensor_type_and_llama_cpp(
        kind: str, backend: str, command: str, files: dict[str, Path], home: Path) -> None:
    args = BENCH if command == "bench" else ("--ctx", "16")
    err = _one_line(run_cli(command, str(files[kind]), "-B", backend, *args, home=home))
    assert kind in err and "llamacpp" in err.replace(".", "").replace("llama.cpp", "llamacpp")
    assert "weight" in err  # the tensor, by name


@pytest.mark.parametrize("backend", ["torch", "lab"])
def test_truncated_block_data_is_one_line(backend: str, files: dict[str, Path],
                                          home: Path) -> None:
    err = _one_line(run_cli("bench", str(files["cut"]), "-B", backend, *BENCH, home=home))
    assert str(files["cut"]) in err and "truncated" in err


def test_the_backend_named_runs_the_refused_file(files: dict[str, Path], home: Path) -> None:
    """The refusals say --backend llamacpp: it must really run that file."""
    proc = run_cli("bench", str(files["Q1_0"]), "-B", "llamacpp", *BENCH, home=home)
    assert proc.returncode == 0, proc.stderr[-2000:]
