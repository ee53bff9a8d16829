"""strata's one executor (strata.engine): architectures declared once, any layer range, lab
or torch ops — checked against references that share none of its code.

  * A toy architecture added from a temp folder (STRATA_ARCH_PATH), following the recipe of
    docs/architecture.md §11.6 word for word: q/k head norms, NeoX RoPE, an embedding
    scale, q/k/v biases, a tied head — its logits against a plain numpy forward written here
    from the architecture's description, on the lab's kernels and on the torch twin.
  * A q8_0 file split into ring stages on lab ops: the stages hold exactly the bytes gguf-py
    reports for their tensors, and their chained logits equal one `-B lab` model's.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

from strata.engine import load  # noqa: E402
from strata.errors import InputError  # noqa: E402
from strata.models import arch  # noqa: E402
from tests.seed_host import seed_host  # noqa: E402

H, HEADS, KV_HEADS, D, FFN, VOCAB, LAYERS = 64, 4, 2, 16, 96, 200, 2
EPS = 1e-6
THETA = 10000.0

TOY_FILE = textwrap.dedent('''\
    """toy: a made-up architecture (tests/test_engine.py): Qwen-3-like q/k head norms,
    optional q/k/v biases, NeoX RoPE, an embedding scaled by sqrt(hidden)."""

    from strata.models.arch import register
    from strata.models.arch.spec import ATTENTION, DENSE_MLP, QK_NORMS, QKV_BIASES, Arch

    ARCH = register(Arch("toy", (*ATTENTION, *QKV_BIASES, *QK_NORMS, *DENSE_MLP),
                         rope="neox", mlp="{mlp}", embed_scale="sqrt_hidden"))
''')


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("engine-home")
    seed_host(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(path))
        yield path


def toy_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def m(*shape: int, scale: float = 0.15) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {"token_embd.weight": m(VOCAB, H, scale=0.05),
         "output_norm.weight": 1 + m(H, scale=0.1)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.update({p + "attn_norm.weight": 1 + m(H, scale=0.1),
                  p + "attn_q.weight": m(HEADS * D, H), p + "attn_q.bias": m(HEADS * D),
                  p + "attn_k.weight": m(KV_HEADS * D, H), p + "attn_k.bias": m(KV_HEADS * D),
                  p + "attn_v.weight": m(KV_HEADS * D, H), p + "attn_v.bias": m(KV_HEADS * D),
                  p + "attn_q_norm.weight": 1 + m(D, scale=0.1),
                  p + "attn_k_norm.weight": 1 + m(D, scale=0.1),
                  p + "attn_output.weight": m(H, HEADS * D),
                  p + "ffn_norm.weight": 1 + m(H, scale=0.1),
                  p + "ffn_gate.weight": m(FFN, H), p + "ffn_up.weight": m(FFN, H),
                  p + "ffn_down.weight": m(H, FFN)})
    return w


def write_toy(path: Path, weights: dict[str, np.ndarray], name: str = "toy") -> Path:
    """A GGUF of architecture `name` written by gguf-py (no strata code)."""
    w = gguf.GGUFWriter(str(path), name)
    w.add_block_count(LAYERS)
    w.add_context_length(128)
    w.add_embedding_length(H)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_freq_base(THETA)
    for n, v in weights.items():
        w.add_tensor(n, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- the reference: the toy's description as plain numpy (float64) --------------------------


def _rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return w * x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)


def _neox(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Rotate pairs (i, i + D/2) of x [T, heads, D] by position x theta^(-2i/D)."""
    inv = THETA ** (-np.arange(0, D, 2) / D)
    ang = positions[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def reference_logits(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    g = {k: v.astype(np.float64) for k, v in w.items()}
    t = len(ids)
    x = g["token_embd.weight"][ids] * np.sqrt(H)
    pos = np.arange(t, dtype=np.float64)
    for i in range(LAYERS):
        p = f"blk.{i}."
        h = _rms(x, g[p + "attn_norm.weight"])
        q = (h @ g[p + "attn_q.weight"].T + g[p + "attn_q.bias"]).reshape(t, HEADS, D)
        k = (h @ g[p + "attn_k.weight"].T + g[p + "attn_k.bias"]).reshape(t, KV_HEADS, D)
        v = (h @ g[p + "attn_v.weight"].T + g[p + "attn_v.bias"]).reshape(t, KV_HEADS, D)
        q = _neox(_rms(q, g[p + "attn_q_norm.weight"]), pos)
        k = _neox(_rms(k, g[p + "attn_k_norm.weight"]), pos)
        out = np.zeros((t, HEADS, D))
        for head in range(HEADS):
            kv = head // (HEADS // KV_HEADS)
            s = q[:, head] @ k[:, kv].T / np.sqrt(D)
            s = np.where(np.tril(np.ones((t, t))) > 0, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, head] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + out.reshape(t, HEADS * D) @ g[p + "attn_output.weight"].T
        h = _rms(x, g[p + "ffn_norm.weight"])
        gate = h @ g[p + "ffn_gate.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ g[p + "ffn_up.weight"].T)) \
            @ g[p + "ffn_down.weight"].T
    return _rms(x, g["output_norm.weight"]) @ g["token_embd.weight"].T  # tied head


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict]]:
    folder = tmp_path_factory.mktemp("archs")
    (folder / "toy.py").write_text(TOY_FILE.format(mlp="swiglu"))
    weights = toy_weights()
    path = write_toy(tmp_path_factory.mktemp("toy") / "toy.gguf", weights)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(arch.ARCH_PATH_ENV, str(folder))
        yield path, weights


IDS = [3, 17, 199, 42, 5, 88, 120, 7, 64]


@pytest.mark.parametrize("ops", ["torch", "lab"])
def test_a_toy_architecture_from_a_folder_runs_on_both_ops(home: Path, toy: tuple, ops: str
                                                           ) -> None:
    path, weights = toy
    assert "toy" in arch.names()
    ex = load(path, ops=ops)
    ex.reset(32)
    got = ex.forward(torch.tensor(IDS), 0).numpy()
    want = reference_logits(weights, IDS)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= 2e-5 * max(1.0, scale), np.abs(got - want).max()
    # the same positions again, one token at a time over the cache (decode)
    ex.reset(32)
    ex.forward(torch.tensor(IDS[:-2]), 0)
    steps = [ex.forward(torch.tensor([t]), len(IDS) - 2 + j).numpy()[0]
             for j, t in enumerate(IDS[-2:])]
    assert np.abs(np.stack(steps) - want[-2:]).max() <= 2e-5 * max(1.0, scale)


def converter_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf LlamaModel.permute (weights and biases alike)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def test_normal_rope_files_are_unpermuted_biases_too(home: Path, tmp_path: Path) -> None:
    """An architecture declared rope="normal" is stored with its q/k rows (and biases)
    permuted by the converter; the loader undoes it, so the half-split reference holds."""
    folder = tmp_path / "archs"
    folder.mkdir()
    (folder / "toyn.py").write_text(TOY_FILE.format(mlp="swiglu").replace('"toy"', '"toyn"')
                                    .replace('rope="neox"', 'rope="normal"'))
    weights = toy_weights(seed=3)
    permuted = dict(weights)
    for i in range(LAYERS):
        for n, heads in (("q", HEADS), ("k", KV_HEADS)):
            for kind in ("weight", "bias"):
                name = f"blk.{i}.attn_{n}.{kind}"
                permuted[name] = converter_permute(weights[name], heads)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(arch.ARCH_PATH_ENV, str(folder))
        ex = load(write_toy(tmp_path / "toyn.gguf", permuted, name="toyn"), ops="lab")
    ex.reset(16)
    want = reference_logits(weights, IDS)
    got = ex.forward(torch.tensor(IDS), 0).numpy()
    assert np.abs(got - want).max() <= 2e-5 * max(1.0, np.abs(want).max())


def test_each_declared_part_matters(home: Path, toy: tuple, tmp_path: Path) -> None:
    """Dropping the q/k norms from the weights (unit weights) or the bias moves the logits
    well past the tolerance: the reference and the executor really apply them."""
    _path, weights = toy
    base = reference_logits(weights, IDS)
    for name in ("blk.0.attn_q_norm.weight", "blk.1.attn_k.bias"):
        changed = dict(weights)
        changed[name] = np.ones_like(weights[name]) if "norm" in name else \
            np.zeros_like(weights[name])
        ex = load(write_toy(tmp_path / f"{name}.gguf", changed), ops="torch")
        ex.reset(16)
        got = ex.forward(torch.tensor(IDS), 0).numpy()
        assert np.abs(got - reference_logits(changed, IDS)).max() <= 2e-5 * np.abs(base).max()
        assert np.abs(got - base).max() > 1e-3


def test_a_file_that_breaks_its_declaration_is_one_line(home: Path, toy: tuple,
                                                        tmp_path: Path) -> None:
    _, weights = toy
    missing = {k: v for k, v in weights.items() if k != "blk.1.attn_q_norm.weight"}
    with pytest.raises(InputError, match=r"blk\.1 has no attn_q_norm\.weight"):
        load(write_toy(tmp_path / "missing.gguf", missing), ops="torch")
    extra = {**weights, "blk.0.ffn_gate_shexp.weight": weights["blk.0.ffn_gate.weight"]}
    with pytest.raises(InputError, match="has no place in a toy layer"):
        load(write_toy(tmp_path / "extra.gguf", extra), ops="torch")
    with pytest.raises(InputError, match=r"runs the .*llama.* architectures, not nothere"):
        load(write_toy(tmp_path / "unknown.gguf", weights, name="nothere"), ops="torch")


def test_a_declared_gelu_mlp_runs_on_the_lab_as_on_torch(home: Path, tmp_path: Path) -> None:
    """A plugin architecture declaring a GeGLU MLP gets the lab's gelu_mul (ggml's GELU) with
    nothing else written: the same logits as the torch ops, and not a SwiGLU's."""
    folder = tmp_path / "archs"
    folder.mkdir()
    (folder / "toyg.py").write_text(TOY_FILE.format(mlp="geglu").replace('"toy"', '"toyg"'))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(arch.ARCH_PATH_ENV, str(folder))
        path = write_toy(tmp_path / "toyg.gguf", toy_weights(), name="toyg")
        out = {}
        for ops in ("lab", "torch"):
            ex = load(path, ops=ops)
            ex.reset(8)
            with torch.inference_mode():
                out[ops] = ex.forward(torch.tensor(IDS[:4]), 0)
        assert "gelu_mul" in ex_ops(load(path, ops="lab"))
    torch.testing.assert_close(out["lab"], out["torch"], rtol=0, atol=1e-4)
    swiglu = reference_logits(toy_weights(), IDS[:4])  # the same weights through silu
    assert float((out["torch"] - torch.from_numpy(swiglu)).abs().max()) > 1e-2


def ex_ops(ex: object) -> set[str]:
    return set(ex.ops.kernels.choices)  # type: ignore[attr-defined]


def test_a_broken_architecture_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("raise RuntimeError('oops')\n")
    with pytest.raises(InputError, match=r"bad\.py does not load: RuntimeError: oops"):
        arch.load_folder(tmp_path)


# -- ring stages on lab ops hold the file's bytes and compute what -B lab computes -----------


def test_lab_stages_hold_the_stored_bytes_and_chain_to_the_lab_models_logits(home: Path
                                                                             ) -> None:
    import strata.lab
    from strata.models.source import resolve
    from strata.ring.runtime.stage import Stage, stage_bytes

    path = resolve("synthetic:tiny-deep@q8_0").path("gguf", "ring")
    reader = gguf.GGUFReader(str(path))
    stored = {t.name: int(t.n_bytes) for t in reader.tensors}
    stages = [Stage.load(str(path), 0, 2), Stage.load(str(path), 2, 4)]
    for s, names in zip(stages, (lambda n: n.startswith(("blk.0.", "blk.1.", "token_embd")),
                                 lambda n: not n.startswith(("blk.0.", "blk.1.", "token_embd"))
                                 ), strict=True):
        want = sum(b for n, b in stored.items() if names(n) and n != "rope_freqs.weight")
        assert s.weight_bytes == want == stage_bytes(s.spec, s.first, s.last, 0)[0]
        assert any(t.kind == "Q8_0" for t in s.tensors.values() if hasattr(t, "kind"))
    ids = [1, 9, 33, 7, 250, 61]
    x = torch.tensor(ids)
    for s in stages:
        s.reset(16)
        x = s.forward(x, 0)
    lab = strata.lab.load(path, "cpu", n_ctx=16)
    want = lab.prefill(ids, logits_from=0)
    assert torch.equal(x, want)
    # torch ops hold float32: 4 bytes a weight
    f32 = Stage.load(str(path), 2, 4, ops="torch")
    assert f32.weight_bytes == stage_bytes(f32.spec, 2, 4, 0, "torch")[0] > 3 * \
        stages[1].weight_bytes


@pytest.mark.parametrize("ops", ["lab", "torch"])
def test_a_prompt_longer_than_a_chunk_is_run_in_chunks_with_the_same_logits(home: Path,
                                                                            ops: str) -> None:
    """A ring stage's prefill (any executor's) of more positions than its chunk runs chunk
    by chunk through the cache: the same logits as one pass, to float32's rounding (every
    position attends to the same keys; only the batching differs)."""
    from strata.models.source import resolve
    from strata.ring.runtime.stage import Stage

    path = resolve("synthetic:tiny-deep@f32").path("gguf", "ring")
    ids = torch.tensor([1, *range(300, 337)])  # 38 positions
    outs = {}
    for chunk in (512, 8):
        stage = Stage.load(str(path), 0, 4, ops=ops)
        stage.executor.chunk = chunk
        stage.reset(48)
        calls = []
        forward = stage.executor.forward

        def counted(x, pos, logits_from=0, forward=forward, calls=calls):
            calls.append(x.shape[0])
            return forward(x, pos, logits_from)

        stage.executor.forward = counted
        outs[chunk] = stage.forward(ids, 0)
        assert max(calls[1:] or calls) <= chunk  # the chunks, after the first (whole) call
    assert outs[8].shape == outs[512].shape == (38, outs[512].shape[1])
    scale = float(outs[512].abs().max())
    assert float((outs[8] - outs[512]).abs().max()) <= 1e-5 * scale
