"""-B lab on a real GPU (auto-skipped without one): a GGUF on the lab's Triton kernels gives
the CPU lab's logits (which equal llama.cpp's, tests/test_backend_lab.py), and which kernel
served each op there is printed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

IDS = [1, 37, 290, 5, 77, 411, 98, 12, 300, 64, 129, 7]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("lab-gpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(path))
        yield path


@pytest.mark.parametrize("quant", ["f32", "f16", "q8_0", "q4_0"])
def test_lab_on_the_gpu_gives_the_cpu_logits(home: Path, quant: str) -> None:
    import strata.lab
    from strata.models.source import resolve

    path = resolve(f"synthetic:tiny@{quant}").path("gguf", "lab")
    cpu = strata.lab.load(path, "cpu", n_ctx=64)
    gpu = strata.lab.load(path, "cuda:0", n_ctx=64)
    with torch.inference_mode():
        want = cpu.prefill(IDS, logits_from=0)
        got = gpu.prefill(IDS, logits_from=0).cpu()
        steps = [(cpu.decode(t), gpu.decode(t).cpu()) for t in (3, 4, 5)]
    print(quant, {op: d["impl"] for op, d in gpu.kernels.served().items()})
    assert all(d["outcome"] == "kernel" for d in gpu.kernels.served().values())
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * scale)
    for a, b in steps:
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4 * scale)
