"""strata ring on mixture-of-experts models, against real llama.cpp on the same GGUF.

The reference shares no code with the ring's stages: llama.cpp (llama_cpp.Llama, every
position's logits, an f32 KV cache) reads the same float32 synthetic GGUF and decodes greedily
with its own KV cache. The ring runs in loopback worker processes (LocalRing), 2 stages for
the qwen3moe preset (plus 3 stages of its 4-layer variant) and for the Mixtral one.

Tolerance: TOL = 1e-4 absolute on the logits, whose scale here is ~1 (|logit| <= ~1): both
sides compute in float32 and differ only in summation order (ggml's blocked dot products
against torch's, experts summed in another order), which costs ~1e-7 per layer at these
widths (64-128); 1e-4 is three decades above that and still far below anything a wrong
routing, norm or RoPE convention produces (those move logits by ~1e-1).

Routing ties: a token whose k-th and (k+1)-th expert probabilities are closer than float32
noise could pick another expert in llama.cpp than here, and that is not a bug. The test
records the smallest such gap over every layer and position (from the one-stage run); if one
is below TIE, positions from the first tie on are left out of the comparison and the test
says so. With these presets there is none (the printed smallest gap is >= 1e-4).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")

from strata.engine import moe  # noqa: E402
from strata.models.gguf import read_spec  # noqa: E402
from strata.ring.runtime.local import LocalRing  # noqa: E402
from strata.ring.runtime.stage import Stage, stage_bytes  # noqa: E402
from tests.conftest import local_ring, ring_drive  # noqa: E402
from tests.test_gguf_torch import quiet_stderr  # noqa: E402

PROMPT = [1, 17, 300, 42, 7, 511, 100, 3]
DECODE = 16  # decode steps after the prefill's token
TOL = 1e-4
TIE = 1e-5  # a routing gap below this could flip under float32 noise (~1e-7)
QWEN3MOE, QWEN3MOE_DEEP, MIXTRAL = "tiny-moe", "tiny-moe-deep", "tiny-mixtral"


# -- the reference: real llama.cpp ----------------------------------------------------------------


def llama_cpp_greedy(path: Path, prompt: list[int], n_decode: int) -> dict[str, Any]:
    """llama.cpp's prompt logits, then n_decode greedy steps on its own KV cache."""
    from llama_cpp import Llama

    n_ctx = len(prompt) + n_decode + 1
    with quiet_stderr():
        llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                    logits_all=True, type_k=0, type_v=0, n_threads=1, verbose=False)
        try:
            llm.eval(prompt)
            tokens = [int(np.argmax(llm.scores[len(prompt) - 1]))]
            for _ in range(n_decode):
                llm.eval([tokens[-1]])
                tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            scores = np.array(llm.scores[:llm.n_tokens], dtype=np.float32)
        finally:
            llm.close()
    return {"tokens": tokens, "prefill": scores[:len(prompt)],
            "steps": scores[len(prompt) - 1:]}  # the logits that chose each token


# -- the one-stage run (in this process), with the routing gaps recorded ----------------------


def one_stage(path: Path, prompt: list[int], tokens: list[int]) -> dict[str, Any]:
    """Stage [0, n_layers) over the prompt then the given tokens one at a time (teacher
    forcing on the ring's tokens), and the smallest top-k gap per position."""
    gaps: dict[int, float] = {}
    route, pos = moe.route, [0]

    def recording(logits: torch.Tensor, n_used: int, renormalise: bool,
                  gating: str = "softmax") -> tuple[torch.Tensor, torch.Tensor]:
        top = torch.topk(torch.softmax(logits, dim=-1), n_used + 1, dim=-1).values
        for i, g in enumerate((top[:, -2] - top[:, -1]).tolist()):
            gaps[pos[0] + i] = min(g, gaps.get(pos[0] + i, 1.0))
        return route(logits, n_used, renormalise, gating)

    stage = Stage.load(str(path), 0, read_spec(path).n_layers)
    stage.reset(len(prompt) + len(tokens))
    moe.route = recording  # type: ignore[assignment]
    try:
        prefill = stage.forward(torch.tensor(prompt), 0).numpy()
        steps = [prefill[-1]]
        for i, t in enumerate(tokens[:-1]):
            pos[0] = len(prompt) + i
            steps.append(stage.forward(torch.tensor([t]), pos[0]).numpy()[-1])
    finally:
        moe.route = route  # type: ignore[assignment]
    return {"prefill": prefill, "steps": np.stack(steps), "gaps": gaps, "stage": stage}


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ring() -> Iterator[LocalRing]:
    """Three worker processes for the whole module; none left afterwards."""
    yield from local_ring(3)


@pytest.fixture(scope="module")
def models(ring: LocalRing, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, dict[str, Any]]]:
    """The presets' float32 GGUFs and llama.cpp's generations (while the workers start)."""
    from strata.models.source import resolve

    old, threads = os.environ.get("STRATA_HOME"), torch.get_num_threads()
    os.environ["STRATA_HOME"] = str(tmp_path_factory.mktemp("strata-home"))
    torch.set_num_threads(1)  # as the workers: the same kernels, the same sums
    try:
        out = {}
        for preset in (QWEN3MOE, QWEN3MOE_DEEP, MIXTRAL):
            path = resolve(f"synthetic:{preset}@f32").path("gguf", "ring")
            out[preset] = {"path": path, **llama_cpp_greedy(path, PROMPT, DECODE)}
        yield out
    finally:
        torch.set_num_threads(threads)
        if old is None:
            os.environ.pop("STRATA_HOME", None)
        else:
            os.environ["STRATA_HOME"] = old


# -- tests ----------------------------------------------------------------------------------------


def test_a_moe_stage_holds_every_expert_of_its_layers(models: dict[str, dict[str, Any]]) -> None:
    path = models[QWEN3MOE_DEEP]["path"]
    spec = read_spec(path)
    middle = Stage.load(str(path), 1, 3)
    assert middle.moe is not None and (middle.moe.n_experts, middle.moe.n_used) == (8, 2)
    assert middle.tensors["blk.1.ffn_gate_exps.weight"].shape == (8, 64, 64)
    assert middle.tensors["blk.2.ffn_down_exps.weight"].shape == (8, 64, 64)
    assert sorted({n.split(".")[1] for n in middle.tensors}) == ["1", "2"]
    # memory counts all experts: the stage's bytes are the spec's, experts included
    weights, _ = stage_bytes(spec, 1, 3, 0)
    expert = sum(t.nbytes for n, t in middle.tensors.items() if "_exps." in n)  # f32 file
    assert middle.weight_bytes == weights and expert == 2 * 3 * 8 * 64 * 64 * 4


@pytest.mark.parametrize(("preset", "world"), [(QWEN3MOE, 2), (QWEN3MOE_DEEP, 3), (MIXTRAL, 2)])
def test_moe_ring_matches_llama_cpp(ring: LocalRing, models: dict[str, dict[str, Any]],
                                    preset: str, world: int) -> None:
    ref = models[preset]
    res = ring_drive(ring, ref["path"], world, PROMPT, DECODE + 1)
    single = one_stage(ref["path"], PROMPT, res["tokens"])
    ring_steps = np.stack(res["step_logits"])

    # one stage and the ring run the same code on the same numbers: equal to the bit
    assert np.array_equal(res["prefill_logits"], single["prefill"])
    assert np.array_equal(ring_steps, single["steps"])

    gaps = single["gaps"]
    ties = sorted(p for p, g in gaps.items() if g < TIE)
    end = ties[0] if ties else len(PROMPT) + DECODE  # positions before the first near tie
    prefill = float(np.abs(res["prefill_logits"] - ref["prefill"])[:end].max(initial=0.0))
    n_steps = max(0, end - len(PROMPT) + 1)
    steps = float(np.abs(ring_steps - ref["steps"])[:n_steps].max(initial=0.0))
    scale = float(np.abs(ref["prefill"]).max())
    print(f"\n{preset} on {world} stages vs llama.cpp: max |dlogits| prefill {prefill:.2e}, "
          f"{DECODE} decode steps {steps:.2e} (logit scale {scale:.2f}); smallest routing "
          f"gap {min(gaps.values()):.1e}; near ties at positions {ties or 'none'}; "
          f"tokens equal: {res['tokens'] == ref['tokens']}")
    assert prefill <= TOL and steps <= TOL
    if not ties:
        assert res["tokens"] == ref["tokens"]
        assert len(res["tokens"]) == DECODE + 1
