"""strata's decode-step runner (lab/runner.py, lab/csrc/runner.c): the bound decode step as
one list of kernel and glue steps, consecutive native ones run by a single C call.

The reference is the same step run from Python (each bound thunk, torch's add_ and copy_),
which the profile mode still uses: the logits must be equal bit for bit on every declared
variant (biases, post-norms, a sliding window slid past, routed experts with sinks).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from strata.engine import kvcache
from strata.kernels.ops._linear_q import q8_0_blocks
from strata.lab import runner
from strata.models.source import resolve
from tests.conftest import seeded_home

TOKENS = [5, 6, 7, 8, 9, 10, 11, 12] * 3  # 28 positions with the prompt: past a 16 window


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from seeded_home(tmp_path_factory, "lab_runner")


def _decode(path: Path, profile: bool, kv: str = "f32") -> tuple[torch.Tensor, object]:
    import strata.lab

    m = strata.lab.load(path, "cpu", n_ctx=64, kv=kv)
    m.kernels.profile = profile
    m.prefill([1, 2, 3, 4])
    return torch.cat([m.decode(t) for t in TOKENS]), m._step


@pytest.mark.parametrize(("preset", "kv"), [
    ("tiny-qwen2@q8_0", "f32"), ("tiny-gemma3@q8_0", "f32"), ("tiny-gpt-oss@q8_0", "f32"),
    ("tiny-phi3@f32", "f32"),
    # a float16 cache: the runner's K/V rows rounded as torch's copy_ rounds them
    ("tiny-gemma3@q8_0", "f16"), ("tiny-gpt-oss@q8_0", "f16"),
    # a q8_0 cache: the runner's rows quantised as strata.kernels.ops._linear_q's q8_0_blocks
    ("tiny-gemma3@q8_0", "q8_0"), ("tiny-gpt-oss@q8_0", "q8_0")])
def test_runner_gives_the_python_step_s_logits_bit_for_bit(home: Path, preset: str,
                                                           kv: str) -> None:
    path = resolve(f"synthetic:{preset}").path("gguf", "llamacpp")
    native, step = _decode(path, profile=False, kv=kv)
    python, _ = _decode(path, profile=True, kv=kv)
    assert torch.equal(native, python)
    program = step.program  # type: ignore[attr-defined]
    # every layer's K/V writes and residual adds ran natively (none was left to torch)
    n_layers = len(step.layers)  # type: ignore[attr-defined]
    glue = program.native_glue()
    assert glue["kv_store"] == 2 * n_layers and glue["add"] >= 2 * n_layers
    if preset.startswith("tiny-gpt-oss"):  # the routing is Python: one segment around each
        assert len(program.segments) > 1
    else:
        assert len(program.segments) == 1


def _tensors() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(8, dtype=torch.float32), torch.full((8,), 0.5)


def test_python_steps_run_in_place_between_native_stretches() -> None:
    x, y = _tensors()
    seen: list[torch.Tensor] = []
    steps = [runner.add_step(x, y), runner.Step(runner.GLUE, lambda: seen.append(x.clone())),
             runner.add_step(x, y), runner.add_step(x, y)]
    program = runner.Program(steps)
    assert len(program.segments) == 3  # native, Python, native (the last two together)
    program()
    assert torch.equal(seen[0], torch.arange(8) + 0.5)
    assert torch.equal(x, torch.arange(8) + 1.5)


def test_a_kv_row_outside_the_cache_is_refused_not_written() -> None:
    cache = torch.zeros(2, 4, 3)
    src = torch.ones(2, 3)
    at = torch.tensor([4], dtype=torch.int64)  # one past the last row
    program = runner.Program([runner.kv_step(cache, src, at)])
    with pytest.raises(ValueError, match="outside the cache"):
        program()
    assert not cache.any()
    at[0] = 2
    program()
    assert torch.equal(cache[:, 2], src) and int((cache != 0).sum()) == 6


def test_a_float16_cache_row_is_rounded_as_torch_rounds_it() -> None:
    """The runner's float16 K/V store against torch's conversion, on the values where a
    rounding rule shows: exact halves between two float16 values (ties to even), the
    subnormal range, past the largest float16 (inf), NaN and signed zeros."""
    f16 = torch.finfo(torch.float16)
    grid = torch.arange(-2048, 2048, dtype=torch.float32)
    halfway = (grid + 0.5) * 2.0 ** -10 + 1.0  # exact ties between neighbouring f16 in [1, 2)
    special = torch.tensor([f16.tiny / 3, -f16.tiny / 7, 2.0 ** -25, 2.0 ** -26, 65519.0,
                            65520.0, 1e30, -1e30, float("nan"), 0.0, -0.0, 1.0 / 3])
    values = torch.cat([halfway, torch.randn(4000, generator=torch.Generator().manual_seed(0))
                        * 1e-3, special])
    d = values.numel() // 2
    src = values[:2 * d].reshape(2, d).contiguous()
    cache = torch.zeros(2, 3, d, dtype=torch.float16)
    at = torch.tensor([1], dtype=torch.int64)
    step = runner.kv_step(cache, src, at)
    assert step.native is not None  # the runner takes it
    runner.Program([step])()
    want = src.to(torch.float16)
    assert torch.equal(cache[:, 1].view(torch.int16), want.view(torch.int16))
    assert not cache[:, [0, 2]].view(torch.int16).any()  # no other row written


def test_a_q8_0_cache_row_is_quantised_as_ggml_quantises_it() -> None:
    """The runner's q8_0 K/V store against the Python store (q8_0_blocks, ggml's AVX2
    quantize_row_q8_0: fp16(amax/127), q = round-half-even(x·(127/amax))) byte for byte, on
    blocks where a rule shows: exact ties x·id = k + 0.5, an all-zero block, a block with a
    NaN or an inf, subnormal and huge values — and no other row written."""
    g = torch.Generator().manual_seed(1)
    ties = torch.arange(-63, 64, 4, dtype=torch.float32)[:31] + 0.5  # -62.5 .. 57.5
    tie_block = torch.cat([torch.tensor([127.0]), ties])  # amax 127: d = 1, id = 1
    blocks = [tie_block, torch.zeros(32), torch.randn(32, generator=g) * 1e-6,
              torch.randn(32, generator=g) * 1e4, torch.randn(32, generator=g),
              torch.randn(32, generator=g), torch.randn(32, generator=g) * 3,
              torch.randn(32, generator=g)]
    blocks[4][3], blocks[5][7] = float("nan"), float("inf")
    src = torch.cat(blocks).reshape(2, 128).contiguous()
    cache = torch.zeros(2, 3, 4 * 34, dtype=torch.uint8)
    at = torch.tensor([2], dtype=torch.int64)
    step = runner.kv_step(cache, src, at)
    assert step.native is not None  # the runner takes it
    runner.Program([step])()
    assert torch.equal(cache[:, 2], q8_0_blocks(src))
    assert not cache[:, :2].any()
    values = kvcache.KV_TYPES["q8_0"].widen(cache[:, 2], torch.float32).reshape(-1)
    assert torch.equal(values[1:32], torch.round(ties))  # k + 0.5 to the even neighbour
    assert not torch.equal(values[1:32], torch.sign(ties) * torch.floor(ties.abs() + 0.5))
    assert not values[32:64].any()  # the all-zero block: d = 0, q = 0
    assert values[128:192].isnan().all()  # a NaN or an inf: a NaN or inf scale, q = 0


def test_steps_the_runner_cannot_take_stay_python() -> None:
    x, y = _tensors()
    strided = torch.zeros(16)[::2]  # not contiguous: torch's add_ keeps it
    assert runner.add_step(strided, y).native is None
    assert runner.add_step(x, y.double()).native is None

    def thunk() -> None:
        x.add_(1)

    # a thunk not tagged by the in-process C dialect (a confined kernel's round trip to its
    # worker, a torch stand-in) is never called natively: its code stays where it runs
    assert runner.kernel_step("linear_f32", thunk).native is None
    thunk.native = (1, list(range(runner.MAX_INTS + 1)), [])  # type: ignore[attr-defined]
    assert runner.kernel_step("linear_f32", thunk).native is None  # too many arguments
    program = runner.Program([runner.add_step(strided, y)])
    program()
    assert torch.equal(strided, torch.full((8,), 0.5))
