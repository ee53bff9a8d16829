"""strata ring stages from a Hugging Face folder (config.json + safetensors).

A tiny Llama (GQA 4/2 heads, F32, saved in several shards with an index) and a tiny Qwen2
(q/k/v biases, tied head, BF16, one file), both written by transformers' save_pretrained from
random weights, split over 2 and 3 ranks: the ring gives transformers' own logits on the same
folder (prefill and 8 greedy decode steps, the same tokens). A stage reads only its own
tensors; a damaged safetensors header is one InputError line.
"""

from __future__ import annotations

import json
import shutil
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from strata.errors import InputError  # noqa: E402
from strata.models.hf import DTYPE_BYTES  # noqa: E402
from strata.ring.runtime.assign import even_split  # noqa: E402
from strata.ring.runtime.local import LocalRing, free_port  # noqa: E402
from strata.ring.runtime.pipeline import choose  # noqa: E402
from strata.ring.runtime.stage import Stage, stage_bytes  # noqa: E402
from tests.conftest import local_ring  # noqa: E402

PROMPT = [1, 17, 300, 42, 7, 511, 100, 3]
N_PREDICT = 9  # the prefill's token + 8 decode steps
TOL = 1e-4
LLAMA, QWEN2 = "llama", "qwen2"
_SHAPES = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 128}


def _write(arch: str, folder: Path) -> None:
    """A random model saved by transformers. Its own init (std 0.02) gives near-uniform
    logits whose argmax is a coin toss; wider weights make greedy tokens a real check."""
    torch.manual_seed(0 if arch == LLAMA else 1)
    if arch == LLAMA:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_SHAPES))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            **_SHAPES, tie_word_embeddings=True, rope_theta=1e6))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.12)
    if arch == LLAMA:  # F32 in many shards: the index maps every tensor to its file
        model.save_pretrained(folder, max_shard_size="100KB")
    else:  # BF16 in one file: the stage widens it to float32 as transformers does
        model.to(torch.bfloat16).save_pretrained(folder)


def _reference(folder: Path, prompt: list[int], n: int) -> dict[str, Any]:
    """transformers on the folder itself, float32, in this process."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    ids = list(prompt)
    with torch.no_grad():
        for step in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(choose(logits, 0.0, None, step))
        logits = model(torch.tensor([ids[:-1]])).logits[0].numpy()
    return {"tokens": ids[len(prompt):], "prefill": logits[:len(prompt)],
            "steps": logits[len(prompt) - 1:]}


@pytest.fixture(scope="module")
def ring() -> Iterator[LocalRing]:
    """Three worker processes for the whole module; none left afterwards."""
    yield from local_ring(3)


@pytest.fixture(scope="module")
def models(ring: LocalRing, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, dict[str, Any]]]:
    """Both folders and their reference generations (computed while the workers start)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers share the cores
    try:
        out = {}
        for arch in (LLAMA, QWEN2):
            folder = tmp_path_factory.mktemp(f"hf-{arch}")
            _write(arch, folder)
            out[arch] = {"path": folder, **_reference(folder, PROMPT, N_PREDICT)}
        yield out
    finally:
        torch.set_num_threads(threads)


_EPOCH = iter(range(1, 1000))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("arch", [LLAMA, QWEN2])
def test_ring_matches_transformers(ring: LocalRing, models: dict[str, dict[str, Any]],
                                   arch: str, world: int) -> None:
    ref, workers = models[arch], list(range(world))
    common = {"port": free_port(), "world": world, "epoch": next(_EPOCH), "timeout_s": 30.0,
              "op_timeout_s": 30.0, "model": str(ref["path"]),
              "assignments": [(a.rank, a.first, a.last) for a in even_split(4, world)]}
    for rank, w in enumerate(workers[1:], start=1):
        ring.send(w, op="serve", rank=rank, **common)
    t0 = time.perf_counter()
    ring.send(0, op="drive", **common, prompt=PROMPT, n_predict=N_PREDICT, keep_logits=True)
    answer = ring.answer(0)
    ring.send(0, op="stop")
    assert ring.answer(0)["ok"]
    for w in workers[1:]:
        assert ring.answer(w) == {"ok": True, "stopped": True}
    assert answer["ok"], answer
    res = answer["result"]
    prefill = float(np.abs(res["prefill_logits"] - ref["prefill"]).max())
    steps = float(np.abs(np.stack(res["step_logits"]) - ref["steps"]).max())
    print(f"\nHF {arch} on {world} ranks: max |dlogits| prefill {prefill:.2e}, 8 decode "
          f"steps {steps:.2e} (logits span {np.ptp(ref['steps']):.1f}); "
          f"{time.perf_counter() - t0:.1f} s")
    assert res["tokens"] == ref["tokens"]
    assert prefill <= TOL and steps <= TOL


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(HF name, bytes) of every tensor a stage reads from here on."""
    import strata.ring.runtime.stage_hf as stage_hf

    seen: list[tuple[str, int]] = []
    real = stage_hf.read_tensor

    def spy(path: Path, name: str, offset: int, dtype: str, shape: tuple[int, ...]
            ) -> np.ndarray:
        values = real(path, name, offset, dtype, shape)
        seen.append((name, int(np.prod(shape)) * DTYPE_BYTES[dtype]))
        return values

    monkeypatch.setattr(stage_hf, "read_tensor", spy)
    return seen


def test_a_stage_reads_only_its_tensors(models: dict[str, dict[str, Any]],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _reads(monkeypatch)
    llama = models[LLAMA]["path"]
    middle = Stage.load(str(llama), 1, 3)
    layers = {n.split(".")[2] for n, _ in seen}
    assert layers == {"1", "2"} and all(n.startswith("model.layers.") for n, _ in seen)
    assert len(seen) == 2 * 9  # norms, q, k, v, o, gate, up, down of two layers
    # F32: the bytes read are exactly the stage's float32 weights, nothing more
    assert sum(b for _, b in seen) == middle.weight_bytes == stage_bytes(middle.spec, 1, 3,
                                                                         0)[0]
    seen.clear()
    first = Stage.load(str(llama), 0, 1)
    assert "model.embed_tokens.weight" in dict(seen) and "lm_head.weight" not in dict(seen)
    assert "token_embd.weight" in first.tensors
    seen.clear()
    Stage.load(str(llama), 3, 4)
    names = dict(seen)
    assert {"lm_head.weight", "model.norm.weight"} <= set(names)
    assert "model.embed_tokens.weight" not in names
    # qwen2's head is tied: its last stage reads the embedding as its head, and the biases
    seen.clear()
    tied = Stage.load(str(models[QWEN2]["path"]), 3, 4)
    names = dict(seen)
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert "blk.3.attn_q.bias" in tied.tensors and tied.tensors["blk.3.attn_q.bias"].dtype \
        == torch.float32
    # BF16 on disk: half the bytes of the float32 the stage holds
    assert sum(names.values()) * 2 == tied.weight_bytes
    with pytest.raises(InputError, match="missing"):
        Stage.load(str(llama), 0, 4, mem_cap_bytes=100_000, ctx=64)


def test_f16_folder_matches_transformers(tmp_path: Path) -> None:
    """One process, all four layers in two stages, F16 weights (widened exactly)."""
    torch.manual_seed(2)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_SHAPES))
    model.half().save_pretrained(tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    stages = [Stage.load(str(tmp_path), 0, 2), Stage.load(str(tmp_path), 2, 4)]
    ids = torch.tensor(PROMPT)
    h: Any = ids
    for s in stages:
        s.reset(16)
        h = s.forward(h, 0)
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    assert float((h - want).abs().max()) <= TOL


def _damage(src: Path, dst: Path, how: str) -> Path:
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    if how == "length":  # the header claims more bytes than the file has
        f.write_bytes(struct.pack("<Q", len(raw) * 2) + raw[8:])
    else:  # a tensor's data_offsets point past the end of the data
        header = json.loads(raw[8:8 + n])
        name = next(k for k in header if k.endswith("layers.2.mlp.up_proj.weight"))
        begin, end = header[name]["data_offsets"]
        header[name]["data_offsets"] = [begin + len(raw), end + len(raw)]
        text = json.dumps(header).encode()
        f.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])
    return dst


@pytest.mark.parametrize("how", ["length", "offsets"])
def test_damaged_header_is_one_line(models: dict[str, dict[str, Any]], tmp_path: Path,
                                    how: str) -> None:
    folder = _damage(models[QWEN2]["path"], tmp_path / "broken", how)
    with pytest.raises(InputError) as info:
        Stage.load(str(folder), 2, 4)
    message = str(info.value)
    print(f"\n{how}: {message}")
    assert "\n" not in message and "model.safetensors" in message
