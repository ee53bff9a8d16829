"""The llamacpp backend against real llama.cpp (llama-cpp-python) with a tiny synthetic GGUF."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) not installed")

from strata.backends.base import LoadConfig, RunRequest, RunTrace
from strata.backends.llamacpp import LlamaCppBackend
from strata.errors import InputError
from strata.models.source import ResolvedModel, resolve
from strata.models.synthetic import FIRST_TEXT_ID

TINY = "synthetic:tiny@q8_0"
TINY_VOCAB = 512  # presets.json "tiny"
NS_PER_MS = 1e6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResolvedModel]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(tmp_path_factory.mktemp("home")))
        model = resolve(TINY)
        model.path("gguf", "llamacpp")  # write it while STRATA_HOME points at the temp dir
        yield model


@pytest.fixture(scope="module")
def backend(tiny: ResolvedModel) -> Iterator[LlamaCppBackend]:
    b = LlamaCppBackend()
    b.load(tiny, LoadConfig(threads=2))
    yield b
    b.close()


def request(b: LlamaCppBackend, depth: int, prompt: int, gen: int, seed: int = 0) -> RunRequest:
    """Like the harness builds it: BOS first in whatever context comes first."""
    bos = b.bos()
    assert bos is not None
    first = [bos] if depth or prompt else []
    ctx = first + b.random_tokens(depth + prompt - len(first), seed)
    return RunRequest(depth_tokens=tuple(ctx[:depth]), prompt_tokens=tuple(ctx[depth:]),
                      n_gen=gen)


def check_monotonic(trace: RunTrace) -> None:
    stamps = [trace.t_start]
    if trace.t_prefill_end is not None:
        stamps.append(trace.t_prefill_end)
    stamps += trace.token_ns
    assert all(b > a for a, b in pairwise(stamps)), "timestamps must strictly increase"


def test_pp32_counts_and_internal_counters(backend: LlamaCppBackend) -> None:
    trace = backend.run(request(backend, 0, 32, 0))
    assert trace.n_prompt == 32 and trace.n_gen == 0 and trace.token_ns == []
    assert trace.t_prefill_end is not None
    check_monotonic(trace)
    assert trace.internal["n_p_eval"] == 32
    assert trace.internal["n_eval"] == 0
    # Our timed region encloses llama.cpp's own (same run): ours can only be longer.
    ours_ms = (trace.t_prefill_end - trace.t_start) / NS_PER_MS
    assert 0 < trace.internal["t_p_eval_ms"] <= ours_ms + 0.01


def test_tg16_counts_and_internal_counters(backend: LlamaCppBackend) -> None:
    trace = backend.run(request(backend, 0, 0, 16))
    assert trace.n_prompt == 0 and trace.n_gen == 16 and len(trace.token_ns) == 16
    assert trace.t_prefill_end is None
    check_monotonic(trace)
    assert trace.internal["n_eval"] == 16
    assert trace.internal["n_p_eval"] == 0
    ours_ms = (trace.token_ns[-1] - trace.t_start) / NS_PER_MS
    assert 0 < trace.internal["t_eval_ms"] <= ours_ms + 0.01
    assert any("random" in n for n in trace.notes)  # says it does not sample


def test_pp32_tg8_at_depth16_excludes_the_depth(backend: LlamaCppBackend) -> None:
    req = request(backend, 16, 32, 8, seed=3)
    assert req.depth_tokens[0] == backend.bos() and len(req.prompt_tokens) == 32
    trace = backend.run(req)
    assert trace.n_prompt == 32 and len(trace.token_ns) == 8
    check_monotonic(trace)
    assert trace.t_prefill_end is not None and trace.t_prefill_end < trace.token_ns[0]
    # The 16 depth tokens were decoded before the counters were reset: not in them.
    assert trace.internal["n_p_eval"] == 32
    assert trace.internal["n_eval"] == 8


def test_repeated_runs_start_from_an_empty_cache(backend: LlamaCppBackend) -> None:
    # 6 x (48 context + 8 generated) would overflow the per-test n_ctx (256) if the cache
    # were not cleared per run; every run must succeed with identical counts.
    for seed in range(6):
        trace = backend.run(request(backend, 16, 32, 8, seed=seed))
        assert trace.internal["n_p_eval"] == 32 and len(trace.token_ns) == 8
    assert backend.info()["n_ctx"] == 256


def test_random_tokens_are_normal_ids_and_seeded(backend: LlamaCppBackend) -> None:
    a = backend.random_tokens(500, seed=1)
    assert a == backend.random_tokens(500, seed=1)
    assert a != backend.random_tokens(500, seed=2)
    assert all(FIRST_TEXT_ID <= t < TINY_VOCAB for t in a)  # no unk/BOS/EOS/byte tokens
    assert len(set(a)) > 100  # drawn across the vocabulary
    assert backend.bos() == 1


def test_info_reports_effective_settings(backend: LlamaCppBackend) -> None:
    info = backend.info()
    assert info["threads"] == 2 and info["threads_batch"] == 2
    assert info["kv_type"] == "f16" and info["n_gpu_layers"] == 0
    assert info["llama_cpp_python"] and info["system_info"]


def test_context_grows_when_a_larger_test_comes(tiny: ResolvedModel) -> None:
    b = LlamaCppBackend()
    b.load(tiny, LoadConfig(threads=1))
    try:
        b.run(request(b, 0, 8, 0))
        assert b.info()["n_ctx"] == 256
        trace = b.run(request(b, 0, 300, 4))
        assert b.info()["n_ctx"] == 512
        assert trace.internal["n_p_eval"] == 300 and len(trace.token_ns) == 4
        assert any("re-created" in n for n in trace.notes)
    finally:
        b.close()


def test_prompt_longer_than_n_batch_is_chunked(tiny: ResolvedModel) -> None:
    b = LlamaCppBackend()
    b.load(tiny, LoadConfig(threads=1, batch=16, ubatch=16))
    try:
        trace = b.run(request(b, 0, 40, 2))  # 16 + 16 + 8
        assert trace.internal["n_p_eval"] == 40 and len(trace.token_ns) == 2
    finally:
        b.close()


def test_fixed_n_ctx_too_small_is_an_input_error(tiny: ResolvedModel) -> None:
    b = LlamaCppBackend()
    b.load(tiny, LoadConfig(threads=1, n_ctx=256))
    try:
        with pytest.raises(InputError, match="needs 300 tokens of context"):
            b.run(request(b, 0, 290, 10))
    finally:
        b.close()


def test_kv_type_the_model_cannot_use_is_a_clear_load_error(tiny: ResolvedModel) -> None:
    # tiny's head_dim is 16: a q8_0 K cache (32-element blocks) cannot hold its heads.
    with pytest.raises(InputError, match="block size 32 does not divide") as err:
        LlamaCppBackend().load(tiny, LoadConfig(threads=1, kv_type="q8_0", flash_attn=True))
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResolvedModel]:
    """A real preset (head_dim 64) for what tiny's shapes cannot do: quantised KV."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(tmp_path_factory.mktemp("home-small")))
        model = resolve("synthetic:smollm2-135m@q4_0")  # 77 MB, written in ~2 s
        model.path("gguf", "llamacpp")
        yield model


@pytest.mark.slow
@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_quantised_kv_cache_loads_and_runs(small: ResolvedModel, kv_type: str) -> None:
    b = LlamaCppBackend()
    b.load(small, LoadConfig(threads=2, kv_type=kv_type, kv_type_v=kv_type, flash_attn=True,
                             n_ctx=256))
    try:
        trace = b.run(request(b, 8, 16, 4))
        assert trace.internal["n_p_eval"] == 16 and len(trace.token_ns) == 4
        assert b.info()["kv_type"] == kv_type
    finally:
        b.close()


@pytest.mark.slow
def test_quantised_v_cache_without_flash_attention_is_refused(small: ResolvedModel) -> None:
    # llama.cpp refuses it ("quantized V cache requires flash_attn"); strata names the flag
    with pytest.raises(InputError, match="add -fa 1"):
        LlamaCppBackend().load(small, LoadConfig(threads=2, kv_type_v="q8_0", flash_attn=False))
    b = LlamaCppBackend()  # a quantised K cache alone needs no flash attention
    b.load(small, LoadConfig(threads=2, kv_type="q8_0", flash_attn=False, n_ctx=256))
    b.close()


def test_unknown_kv_type_is_an_input_error(tiny: ResolvedModel) -> None:
    with pytest.raises(InputError, match="kv_type q5_9"):
        LlamaCppBackend().load(tiny, LoadConfig(kv_type="q5_9"))


def _file_model(path: Path) -> ResolvedModel:
    return ResolvedModel(ref=str(path), kind="gguf", spec=None, artefacts={"gguf": path})


def test_truncated_gguf_is_a_one_line_input_error(tiny: ResolvedModel, tmp_path: Path) -> None:
    good = tiny.path("gguf", "llamacpp")
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(InputError) as err:
        LlamaCppBackend().load(_file_model(bad), LoadConfig(threads=1))
    msg = str(err.value)
    assert str(bad) in msg and "\n" not in msg


def test_garbage_file_is_a_one_line_input_error(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(InputError) as err:
        LlamaCppBackend().load(_file_model(bad), LoadConfig(threads=1))
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such GGUF"):
        LlamaCppBackend().load(_file_model(tmp_path / "nope.gguf"), LoadConfig())


def test_model_can_be_loaded_again_after_close(tiny: ResolvedModel, tmp_path: Path) -> None:
    copy = tmp_path / "copy.gguf"
    shutil.copy(tiny.path("gguf", "llamacpp"), copy)
    b = LlamaCppBackend()
    for _ in range(2):
        b.load(_file_model(copy), LoadConfig(threads=1))
        assert len(b.run(request(b, 0, 4, 2)).token_ns) == 2
        b.close()
