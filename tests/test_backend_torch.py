"""The torch backend with real PyTorch + transformers on the synthetic tiny presets (CPU).

Nothing of ours is mocked: the model is `synthetic:tiny` written by strata's own writer and run
by transformers; forward hooks on the real model observe what each call fed it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from strata.backends import create  # noqa: E402
from strata.backends.base import BackendUnavailable, LoadConfig, RunRequest  # noqa: E402
from strata.backends.torch_backend import TorchBackend, choose_dtype  # noqa: E402
from strata.bench.metrics import compute  # noqa: E402
from strata.errors import InputError  # noqa: E402
from strata.models.source import ResolvedModel, resolve  # noqa: E402

F32 = LoadConfig(dtype="float32", threads=2)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One STRATA_HOME for the module, so the synthetic models are written once."""
    path = tmp_path_factory.mktemp("strata-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(path))
        yield path


@pytest.fixture(scope="module")
def tiny(home: Path) -> ResolvedModel:
    model = resolve("synthetic:tiny@f16")
    assert home in model.path("hf", "torch").parents  # never the user's cache
    return model


@pytest.fixture(scope="module")
def backend(tiny: ResolvedModel) -> Iterator[TorchBackend]:
    b = create("torch")
    assert isinstance(b, TorchBackend)
    b.load(tiny, F32)
    yield b
    b.close()


@dataclass
class Call:
    n_input: int  # tokens fed to this forward call
    past: int  # tokens already in the KV cache when it was made
    first_position: int


@pytest.fixture
def calls(backend: TorchBackend) -> Iterator[list[Call]]:
    """Every forward call the model receives while the test runs."""
    seen: list[Call] = []

    def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = cache.get_seq_length() if cache is not None else 0
        seen.append(Call(ids.shape[1], past, int(kwargs["position_ids"][0, 0])))

    handle = backend.model.register_forward_pre_hook(hook, with_kwargs=True)
    yield seen
    handle.remove()


def request(b: TorchBackend, depth: int, prompt: int, gen: int, seed: int = 0) -> RunRequest:
    bos = b.bos()
    ids = b.random_tokens(depth + prompt, seed)
    if ids and bos is not None:
        ids[0] = bos  # BOS first, as the sweep does
    return RunRequest(tuple(ids[:depth]), tuple(ids[depth:]), gen)


# -- counts and timestamps ------------------------------------------------------------------


@pytest.mark.parametrize(("depth", "prompt", "gen"), [(0, 16, 0), (0, 0, 8), (8, 16, 4)],
                         ids=["pp16", "tg8", "pp16+tg4@d8"])
def test_trace_has_exactly_the_requested_counts(backend: TorchBackend, calls: list[Call],
                                                depth: int, prompt: int, gen: int) -> None:
    trace = backend.run(request(backend, depth, prompt, gen))
    assert (trace.n_prompt, trace.n_gen, len(trace.token_ns)) == (prompt, gen, gen)
    assert trace.t_prefill_end is not None
    stamps = [trace.t_start, trace.t_prefill_end, *trace.token_ns]
    assert all(b >= a for a, b in pairwise(stamps)), stamps
    # one untimed depth call, one prompt call, then exactly `gen` single-token steps
    expected = [n for n in (depth, prompt) if n] + [1] * gen
    assert [c.n_input for c in calls] == expected
    metrics = compute(trace)
    assert (metrics.prefill_tps is not None) == bool(prompt)
    assert (metrics.decode_tps is not None) == bool(gen)


def test_decode_uses_the_cache_at_depth(backend: TorchBackend, calls: list[Call]) -> None:
    """tg4 @ d64: the prefix is prefilled once; each step feeds 1 token onto a growing cache."""
    backend.run(request(backend, 64, 0, 4))
    assert [(c.n_input, c.past, c.first_position) for c in calls] == [
        (64, 0, 0), (1, 64, 64), (1, 65, 65), (1, 66, 66), (1, 67, 67)]


def test_pure_tg_starts_from_bos(backend: TorchBackend) -> None:
    fed: list[int] = []

    def hook(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        fed.extend(kwargs["input_ids"][0].tolist())

    handle = backend.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        backend.run(RunRequest((), (), 3))
    finally:
        handle.remove()
    assert fed[0] == backend.bos() == 1
    assert len(fed) == 3


def test_runs_do_not_leak_cache_state(backend: TorchBackend, calls: list[Call]) -> None:
    req = request(backend, 8, 16, 2)
    backend.run(req)
    first = len(calls)
    backend.run(req)
    second = calls[first:]
    assert (second[0].n_input, second[0].past) == (8, 0)  # fresh cache: depth from zero
    assert (second[1].n_input, second[1].past) == (len(req.prompt_tokens), 8)


def test_cached_decode_matches_a_full_forward(backend: TorchBackend) -> None:
    """Positions continue after the depth prefix: the last step's logits through the cache
    equal those of one uncached forward over the whole sequence (wrong positions break it)."""
    fed: list[int] = []
    last: list[torch.Tensor] = []

    def pre(_m: Any, _args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        fed.extend(kwargs["input_ids"][0].tolist())

    def post(_m: Any, _args: tuple[Any, ...], _kwargs: dict[str, Any], out: Any) -> None:
        last.append(out.logits[0, -1].clone())

    model = backend.model
    hooks = [model.register_forward_pre_hook(pre, with_kwargs=True),
             model.register_forward_hook(post, with_kwargs=True)]
    try:
        backend.run(request(backend, 24, 8, 3, seed=5))
    finally:
        for h in hooks:
            h.remove()
    assert len(fed) == 24 + 8 + 3
    with torch.inference_mode():
        full = model(input_ids=torch.tensor([fed]), use_cache=False).logits[0, -1]
    torch.testing.assert_close(last[-1], full, rtol=1e-4, atol=1e-4)


# -- tokens ----------------------------------------------------------------------------------


def test_random_tokens_skip_specials_and_follow_the_seed(backend: TorchBackend) -> None:
    ids = backend.random_tokens(4000, seed=7)
    assert ids == backend.random_tokens(4000, seed=7)
    assert ids != backend.random_tokens(4000, seed=8)
    assert min(ids) >= 0 and max(ids) < 512  # the tiny preset's vocab
    assert not {1, 2} & set(ids)  # BOS and EOS from the config
    assert len(set(ids)) > 400  # uniform over the vocabulary, not a handful of ids


# -- load configuration ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dtype_is_applied_and_reported(tiny: ResolvedModel, dtype: str) -> None:
    threads_before = torch.get_num_threads()  # process-wide: leave it as other tests found it
    b = TorchBackend()
    b.load(tiny, LoadConfig(dtype=dtype, threads=1))
    try:
        info = b.info()
        assert info["dtype"] == info["kv_dtype"] == dtype
        assert {p.dtype for p in b.model.parameters()} == {getattr(torch, dtype)}
        assert info["threads"] == torch.get_num_threads() == 1
        assert info["attn_implementation"] == "sdpa"
        assert info["device"] == "cpu"
        assert info["weight_bytes_in_memory"] == sum(
            p.numel() * p.element_size() for p in b.model.parameters())
        trace = b.run(request(b, 0, 8, 2))
        assert len(trace.token_ns) == 2
    finally:
        b.close()
        torch.set_num_threads(threads_before)


def test_auto_dtype_on_this_cpu_is_never_float16(tiny: ResolvedModel) -> None:
    b = TorchBackend()
    b.load(tiny, LoadConfig(threads=2))
    try:
        info = b.info()
        assert info["checkpoint_dtype"] == "F16"
        assert info["dtype"] in ("float32", "bfloat16")
        assert info["dtype_rule"].startswith("auto: float16 checkpoint")
    finally:
        b.close()


CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(("device", "ckpt", "isa", "ram", "expected"), [
    (CPU, torch.float16, set(), 64 << 30, torch.float32),  # AVX2-class: half is emulated
    (CPU, torch.bfloat16, {"avx2"}, 64 << 30, torch.float32),
    (CPU, torch.float16, {"avx512_bf16"}, 64 << 30, torch.bfloat16),
    (CPU, torch.float16, {"bf16"}, 64 << 30, torch.bfloat16),  # Arm BF16
    (CPU, torch.float16, set(), 1 << 30, torch.bfloat16),  # float32 copy would not fit
    (CPU, torch.float32, set(), 64 << 30, torch.float32),
    (CUDA, torch.float16, set(), 64 << 30, torch.float16),  # GPUs keep the checkpoint's
    (CUDA, torch.bfloat16, set(), 64 << 30, torch.bfloat16),
])
def test_auto_dtype_rule(device: torch.device, ckpt: torch.dtype, isa: set[str], ram: int,
                         expected: torch.dtype) -> None:
    choice = choose_dtype("auto", device, ckpt, checkpoint_bytes=1 << 30, cpu_isa=isa,
                          ram_available=ram)
    assert choice.dtype == expected
    assert choice.rule.startswith("auto")


def test_explicit_dtype_wins_and_unknown_is_an_input_error() -> None:
    assert choose_dtype("float16", CPU, torch.float32, 1).dtype == torch.float16
    with pytest.raises(InputError, match="--dtype int3"):
        choose_dtype("int3", CPU, torch.float32, 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_unavailable_with_a_reason(tiny: ResolvedModel) -> None:
    b = TorchBackend()
    with pytest.raises(BackendUnavailable, match=r"device cuda unavailable: .*(CUDA|cuda)"):
        b.load(tiny, LoadConfig(device="cuda"))


def test_unknown_device_is_an_input_error(tiny: ResolvedModel) -> None:
    with pytest.raises(InputError, match="--device tpu9"):
        TorchBackend().load(tiny, LoadConfig(device="tpu9"))


def test_context_beyond_the_model_is_an_input_error(backend: TorchBackend) -> None:
    with pytest.raises(InputError, match="2049 tokens of context"):
        backend.run(RunRequest((1,) * 2000, (), 49))


# -- GGUF through strata's loader (strata.models.gguf_torch; tests/test_gguf_torch.py holds it
#    to llama.cpp's logits) --------------------------------------------------------------------


def gguf_only(model: ResolvedModel) -> ResolvedModel:
    path = model.path("gguf", "torch")
    return ResolvedModel(ref=str(path), kind="gguf", spec=None, artefacts={"gguf": path})


@pytest.mark.parametrize("ref", ["synthetic:tiny@q4_0", "synthetic:tiny-qwen2@q8_0"])
def test_synthetic_gguf_loads_through_strata(home: Path, ref: str) -> None:
    """llama/qwen2 GGUF at Q4_0/Q8_0, dequantised by gguf-py, run and timed like safetensors."""
    b = TorchBackend()
    b.load(gguf_only(resolve(ref)), F32)
    try:
        info = b.info()
        assert info["weights"].startswith(f"GGUF {ref.rsplit('@')[1].upper()}, dequantised by "
                                          "strata")
        assert b.bos() == 1
        trace = b.run(request(b, 4, 8, 3))
        assert len(trace.token_ns) == 3
    finally:
        b.close()


def test_gguf_architecture_without_a_mapping_names_llamacpp(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    path = tmp_path / "rwkv.gguf"
    w = gguf.GGUFWriter(str(path), arch="rwkv6")  # llama.cpp runs it; strata's loader does not
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model = ResolvedModel(ref=str(path), kind="gguf", spec=None, artefacts={"gguf": path})
    with pytest.raises(InputError) as exc:
        TorchBackend().load(model, F32)
    message = str(exc.value)
    assert "rwkv6" in message and "--backend llamacpp" in message
    assert "\n" not in message


def test_truncated_gguf_is_a_one_line_input_error(home: Path, tmp_path: Path) -> None:
    src = resolve("synthetic:tiny@q8_0").path("gguf", "torch")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    model = ResolvedModel(ref=str(bad), kind="gguf", spec=None, artefacts={"gguf": bad})
    with pytest.raises(InputError) as exc:
        TorchBackend().load(model, F32)
    assert str(bad) in str(exc.value) and "\n" not in str(exc.value)


# -- damaged Hugging Face directories --------------------------------------------------------


def copy_hf(tiny: ResolvedModel, dest: Path) -> Path:
    src = tiny.path("hf", "torch")
    dest.mkdir()
    for f in src.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def hf_model(path: Path) -> ResolvedModel:
    return ResolvedModel(ref=str(path), kind="hf", spec=None, artefacts={"hf": path})


def test_truncated_safetensors_is_a_one_line_input_error(tiny: ResolvedModel,
                                                          tmp_path: Path) -> None:
    d = copy_hf(tiny, tmp_path / "hf")
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(InputError, match="file truncated") as exc:
        TorchBackend().load(hf_model(d), F32)
    assert str(weights) in str(exc.value) and "\n" not in str(exc.value)


def test_safetensors_header_that_lies_is_an_input_error(tiny: ResolvedModel,
                                                         tmp_path: Path) -> None:
    d = copy_hf(tiny, tmp_path / "hf")
    weights = d / "model.safetensors"
    blob = weights.read_bytes()
    # claim the norm weights are twice as wide as the bytes stored for them
    lied = blob.replace(b'"shape":[64]', b'"shape":[128]', 1)
    assert lied != blob
    weights.write_bytes(lied)
    with pytest.raises(InputError, match="header lies"):
        TorchBackend().load(hf_model(d), F32)


def test_directory_without_config_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no config\.json"):
        TorchBackend().load(hf_model(tmp_path), F32)


def test_run_before_load_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="no model loaded"):
        TorchBackend().run(RunRequest((), (1,), 0))
