"""strata ring's data plane on real processes: loopback gloo groups, a tiny Llama (GQA) and a
tiny Qwen2 split over 2 and 3 stages, against transformers in one process (strata's GGUF
loader for torch, which shares no code with the ring's stages); then a stage crashing
(SIGKILL) or hanging (SIGSTOP) mid-generation: PeerLost, a smaller group, replay, the same
tokens — or a clear error when the survivors cannot hold the model. No process outlives it.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from strata.errors import InputError  # noqa: E402
from strata.models.gguf import read_spec  # noqa: E402
from strata.ring.runtime.assign import check_fit, even_split  # noqa: E402
from strata.ring.runtime.local import LocalRing, free_port  # noqa: E402
from strata.ring.runtime.pipeline import choose  # noqa: E402
from strata.ring.runtime.stage import Stage, stage_bytes  # noqa: E402
from tests.conftest import local_ring  # noqa: E402

PROMPT = [1, 17, 300, 42, 7, 511, 100, 3]
N_PREDICT = 33  # the prefill's token + 32 decode steps
TOL = 1e-4
LLAMA, QWEN2 = "tiny-deep", "tiny-qwen2-deep"  # 4 layers: 3 stages, GQA 4/2 heads


# -- the single-process reference (transformers) ------------------------------------------------


def _reference(path: Path, prompt: list[int], n: int, temperature: float = 0.0,
               seed: int | None = None) -> dict[str, Any]:
    from strata.models.gguf_torch import load_gguf_model

    model, _ = load_gguf_model(path, "cpu", torch.float32)
    ids = list(prompt)
    with torch.no_grad():
        for step in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(choose(logits, temperature, seed, step))
        logits = model(torch.tensor([ids[:-1]])).logits[0].numpy()
    return {"tokens": ids[len(prompt):], "prefill": logits[:len(prompt)],
            "steps": logits[len(prompt) - 1:]}


@pytest.fixture(scope="module")
def models(ring: LocalRing, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, dict[str, Any]]]:
    """GGUFs of both presets (written once) and their reference generations (computed while
    the ring's workers start: `ring` comes first)."""
    from strata.models.source import resolve

    old, threads = os.environ.get("STRATA_HOME"), torch.get_num_threads()
    os.environ["STRATA_HOME"] = str(tmp_path_factory.mktemp("strata-home"))
    torch.set_num_threads(1)  # the workers share the cores: more threads only spin
    try:
        out = {}
        for preset in (LLAMA, QWEN2):
            path = resolve(f"synthetic:{preset}@f32").path("gguf", "ring")
            out[preset] = {"path": path, **_reference(path, PROMPT, N_PREDICT)}
        yield out
    finally:
        torch.set_num_threads(threads)
        if old is None:
            os.environ.pop("STRATA_HOME", None)
        else:
            os.environ["STRATA_HOME"] = old


@pytest.fixture(scope="module")
def ring() -> Iterator[LocalRing]:
    """Three worker processes for the whole module; none left afterwards."""
    yield from local_ring(3)
    assert _children() == set()


def _children() -> set[int]:
    """This process's child processes, multiprocessing's resource tracker aside."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())}


@pytest.fixture(autouse=True)
def _no_orphans(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test, the only children left are the ring's live workers."""
    yield
    if "ring" in request.fixturenames:
        ring = request.getfixturevalue("ring")
        assert _children() <= {p.pid for p in ring.procs if p.is_alive()}


# -- helpers --------------------------------------------------------------------------------------

_EPOCH = iter(range(1, 1000))


def _start(ring: LocalRing, workers: list[int], model: Path, op_timeout_s: float = 30.0,
           **stage_opts: Any) -> dict[str, Any]:
    """Workers[1:] serve stages of a new epoch; returns what the driver command needs."""
    world = len(workers)
    common = {"port": free_port(), "world": world, "epoch": next(_EPOCH), "timeout_s": 30.0,
              "op_timeout_s": op_timeout_s, "model": str(model),
              "assignments": [(a.rank, a.first, a.last) for a in even_split(4, world)]}
    for rank, w in enumerate(workers[1:], start=1):
        ring.send(w, op="serve", rank=rank, **common, **stage_opts.get(f"rank{rank}", {}))
    return common


def _stop(ring: LocalRing, workers: list[int]) -> None:
    ring.send(workers[0], op="stop")
    assert ring.answer(workers[0])["ok"]
    for w in workers[1:]:
        assert ring.answer(w) == {"ok": True, "stopped": True}


def _max_diff(result: dict[str, Any], ref: dict[str, Any]) -> tuple[float, float]:
    prefill = float(np.abs(result["prefill_logits"] - ref["prefill"]).max())
    steps = float(np.abs(np.stack(result["step_logits"]) - ref["steps"]).max())
    return prefill, steps


# -- tests ----------------------------------------------------------------------------------------


def test_a_stage_reads_only_its_layers(models: dict[str, dict[str, Any]]) -> None:
    path = models[LLAMA]["path"]
    middle = Stage.load(str(path), 1, 3)
    assert sorted({n.split(".")[1] for n in middle.tensors}) == ["1", "2"]
    assert "token_embd.weight" not in middle.tensors and "output.weight" not in middle.tensors
    first, last = Stage.load(str(path), 0, 1), Stage.load(str(path), 3, 4)
    assert "token_embd.weight" in first.tensors and "output.weight" in last.tensors
    assert (middle.weight_bytes, middle.kv_bytes(64)) == stage_bytes(middle.spec, 1, 3, 64)
    # qwen2's head is tied: the last stage holds token_embd as its head, no output.weight
    tied = Stage.load(f"synthetic:{QWEN2}@f32", 3, 4)
    assert "token_embd.weight" in tied.tensors and "blk.3.attn_q.bias" in tied.tensors
    with pytest.raises(InputError, match="missing"):
        Stage.load(str(path), 0, 4, mem_cap_bytes=100_000, ctx=64)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("preset", [LLAMA, QWEN2])
def test_ring_matches_one_process(ring: LocalRing, models: dict[str, dict[str, Any]],
                                  preset: str, world: int) -> None:
    ref, workers = models[preset], list(range(world))
    common = _start(ring, workers, ref["path"])
    ring.send(0, op="drive", **common, prompt=PROMPT, n_predict=N_PREDICT, keep_logits=True)
    answer = ring.answer(0)
    assert answer["ok"], answer
    _stop(ring, workers)
    res = answer["result"]
    prefill, steps = _max_diff(res, ref)
    links = ", ".join(f"{link['src']}->{link['dst']} {link['bytes_per_token']:.0f} B"
                      for link in res["links"])
    print(f"\n{preset} on {world} ranks: max |dlogits| prefill {prefill:.2e}, 32 decode "
          f"steps {steps:.2e}; TTFT {res['ttft_s'] * 1e3:.1f} ms, ITL median "
          f"{np.median(res['itl_s']) * 1e3:.2f} ms; per token: {links}")
    assert res["tokens"] == ref["tokens"]
    assert prefill <= TOL and steps <= TOL
    assert len(res["itl_s"]) == N_PREDICT - 1 and res["world"] == world
    # every forward link carries a 5 x int64 header + hidden (64) float32 values per token
    assert [link["bytes_per_token"] for link in res["links"][:-1]] == [40 + 64 * 4] * (world - 1)
    assert res["links"][-1]["bytes_per_token"] == 40 + 512 * 4  # the logits come back
    # the decode timeline: every rank reported its stage's compute for the 31 decode steps;
    # the machinery is what the mean gap leaves over, split over the ring's hops
    line = res["timeline"]
    assert line is not None and line["steps"] == N_PREDICT - 1 and line["hops"] == world
    compute = {int(r): ms for r, ms in line["compute_ms_per_token"].items()}
    assert set(compute) == set(range(world)) and all(ms > 0 for ms in compute.values())
    assert line["ms_per_token"] == pytest.approx(np.mean(res["itl_s"]) * 1e3)
    assert line["machinery_ms_per_token"] == pytest.approx(
        line["ms_per_token"] - sum(compute.values()))
    assert line["machinery_ms_per_hop"] == pytest.approx(line["machinery_ms_per_token"] / world)


def test_seeded_sampling_matches_one_process(ring: LocalRing,
                                             models: dict[str, dict[str, Any]]) -> None:
    """Two requests on one group (the stages idle in between): greedy, then sampled."""
    path = models[LLAMA]["path"]
    ref = _reference(path, PROMPT, 12, temperature=0.8, seed=7)
    common = _start(ring, [0, 1], path)
    ring.send(0, op="drive", **common, prompt=PROMPT, n_predict=12)
    greedy = ring.answer(0)
    ring.send(0, op="generate", prompt=PROMPT, n_predict=12, seed=7, temperature=0.8)
    sampled = ring.answer(0)
    _stop(ring, [0, 1])
    assert greedy["ok"] and sampled["ok"], (greedy, sampled)
    assert greedy["result"]["tokens"] == models[LLAMA]["tokens"][:12]
    assert sampled["result"]["tokens"] == ref["tokens"]
    assert ref["tokens"] != models[LLAMA]["tokens"][:12]  # sampling did choose otherwise


def _interrupted(ring: LocalRing, ref: dict[str, Any], victim: int, signal_key: str,
                 op_timeout_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """3 ranks (worker i = rank i); the `victim` gets `signal_key` at its 10th DATA message.
    Returns the driver's PeerLost record and the signal record."""
    common = _start(ring, [0, 1, 2], ref["path"], op_timeout_s=op_timeout_s,
                    **{f"rank{victim}": {signal_key: 10}})
    ring.send(0, op="drive", **common, prompt=PROMPT, n_predict=N_PREDICT)
    lost = ring.answer(0)
    # the driver blames the right rank, even when it only hears of it from rank 2
    assert not lost["ok"] and lost["lost"] == victim, lost
    signalled = ring.answer(victim)
    assert signalled["signal"] == signal_key
    survivor = ring.answer(3 - victim)  # fails at once: a neighbour dropped the group
    assert not survivor["ok"] and "lost" in survivor, survivor
    return lost, signalled


def _resume(ring: LocalRing, ref: dict[str, Any], workers: list[int],
            **extra: Any) -> dict[str, Any]:
    common = _start(ring, workers, ref["path"])
    ring.send(0, op="resume", **{**common, **extra})
    answer = ring.answer(0)
    assert answer["ok"], answer
    _stop(ring, workers)
    return answer


def _replace(ring: LocalRing, worker: int) -> None:
    """Reap a killed worker and put a fresh process in its place."""
    proc = ring.procs[worker]
    proc.kill()
    proc.join(5.0)
    assert not proc.is_alive()
    ring.conns[worker].close()
    index = ring.add()
    ring.procs[worker], ring.conns[worker] = ring.procs.pop(index), ring.conns.pop(index)


def test_hung_stage_is_detected_at_the_deadline(ring: LocalRing,
                                                models: dict[str, dict[str, Any]]) -> None:
    ref = models[QWEN2]
    t0 = time.perf_counter()
    lost, stopped = _interrupted(ring, ref, 2, "hang_at", op_timeout_s=1.5)
    print(f"\nhang: detected after {lost['detect_s'] * 1e3:.0f} ms (deadline 1500 ms), "
          f"{(lost['at'] - stopped['at']) * 1e3:.0f} ms after SIGSTOP")
    assert 1.0 <= lost["detect_s"] <= 5.0
    _replace(ring, 2)  # SIGKILL ends a stopped process too; the next test needs 3 workers
    assert _resume(ring, ref, [0, 1])["result"]["tokens"] == ref["tokens"]
    assert time.perf_counter() - t0 < 30


def test_closing_an_idle_group_ends_serve_stage(ring: LocalRing,
                                                models: dict[str, dict[str, Any]]) -> None:
    """A control plane dropping an epoch from another thread: the idle stage leaves."""
    common = _start(ring, [0, 1], models[LLAMA]["path"], rank1={"close_after_s": 0.3})
    ring.send(0, op="form", **common)
    assert ring.answer(0)["ok"]
    assert ring.answer(1, timeout=10) == {"ok": True, "stopped": True}
    ring.send(0, op="close")
    assert ring.answer(0)["ok"]


def test_a_stage_that_cannot_load_is_reported(ring: LocalRing,
                                              models: dict[str, dict[str, Any]]) -> None:
    common = _start(ring, [0, 1], models[QWEN2]["path"], rank1={"mem_cap": 100_000})
    ring.send(0, op="drive", **common, prompt=PROMPT, n_predict=4)
    driver, stage = ring.answer(0), ring.answer(1)
    assert not stage["ok"] and "missing" in stage["error"], stage
    assert not driver["ok"] and "ring rank 1 cannot serve its stage" in driver["error"]
    assert "may use 97.66 KiB" in driver["error"], driver


def test_crashed_stage_is_replaced_by_replay(ring: LocalRing,
                                             models: dict[str, dict[str, Any]]) -> None:
    ref = models[LLAMA]
    lost, killed = _interrupted(ring, ref, 1, "die_at", op_timeout_s=30.0)
    detect_ms = (lost["at"] - killed["at"]) * 1e3
    ring.procs[1].join(5.0)  # reap the killed worker (nothing after this test needs a third)
    assert ring.procs[1].exitcode == -9
    # the two survivors cannot hold the model under a cap that three ranks can
    model = str(ref["path"])
    spec = read_spec(ref["path"])
    spec_cap = max(sum(stage_bytes(spec, a.first, a.last, len(PROMPT) + N_PREDICT))
                   for a in even_split(4, 3))
    caps = {0: spec_cap, 1: spec_cap, 2: spec_cap}
    check_fit(model, even_split(4, 3), len(PROMPT) + N_PREDICT, caps)
    ring.send(0, op="resume", port=free_port(), world=2, epoch=next(_EPOCH), timeout_s=5.0,
              model=model, caps={0: spec_cap, 1: spec_cap},
              assignments=[(a.rank, a.first, a.last) for a in even_split(4, 2)])
    refused = ring.answer(0)
    assert not refused["ok"] and "remaining ranks cannot hold" in refused["error"], refused
    assert "rank 0 needs" in refused["error"] and "MiB" in refused["error"]
    answer = _resume(ring, ref, [0, 2])  # worker 2 is rank 1 of the new epoch
    res, resumed = answer["result"], answer["result"]["resumes"][0]
    print(f"\ncrash: detected in {detect_ms:.1f} ms (gloo wait {lost['detect_s'] * 1e3:.1f} "
          f"ms), re-formed a 2-rank group in {answer['reform_s'] * 1e3:.1f} ms, replayed "
          f"{resumed['replayed']} positions in {resumed['replay_s'] * 1e3:.1f} ms; "
          f"refused plan: {refused['error']}")
    assert res["tokens"] == ref["tokens"]
    assert resumed["lost_rank"] == 1 and resumed["replayed"] == len(PROMPT) + 8
    assert detect_ms < 2000


# -- in one process: a converter-written GGUF (permuted Q/K, frequency factors) --------------------


def _chain(path: Path, cuts: list[int], ids: list[int], factors: bool = True) -> np.ndarray:
    """Every position's logits through stages [cuts[i], cuts[i + 1]), prefill then decode
    (`factors=False`: the RoPE frequency factors dropped, to show that they matter)."""
    stages = [Stage.load(str(path), a, b) for a, b in itertools.pairwise(cuts)]
    rows = []
    for s in stages:
        if not factors:
            s.executor.weights.rope_freqs = None
        s.reset(len(ids))
    for pos, chunk in ((0, ids[:-3]), *((len(ids) - 3 + i, [t]) for i, t in
                                        enumerate(ids[-3:]))):
        x = torch.tensor(chunk)
        for s in stages:
            x = s.forward(x, pos)
        rows.append(x.numpy())
    return np.concatenate(rows)


def test_stages_undo_the_converters_permutation(tmp_path: Path) -> None:
    """Against transformers built from the original weights (no GGUF, no strata code): a
    wrong un-permutation, rotation or GQA grouping would move these peaked logits by O(1)."""
    from tests.test_gguf_torch import Shape, sample_ids, transformers_logits, write_converter_gguf

    written = write_converter_gguf(tmp_path / "conv.gguf", shape=Shape(n_layers=3))
    ids = sample_ids(written.vocab, 12)
    ours = _chain(written.path, [0, 1, 3], ids)
    ref = transformers_logits(written, ids, tied=False)
    scale = float(np.abs(ref).max())
    print(f"\nconverter GGUF, 2 stages vs transformers: max |dlogits| "
          f"{np.abs(ours - ref).max():.2e} on logits up to {scale:.1f}")
    assert np.abs(ours - ref).max() <= TOL * max(1.0, scale)


def test_stages_apply_rope_frequency_factors(tmp_path: Path) -> None:
    from strata.models.gguf_torch import load_gguf_model
    from tests.test_gguf_torch import Shape, sample_ids, write_converter_gguf

    shape = Shape()
    factors = np.linspace(1.0, 8.0, shape.head_dim // 2).astype(np.float32)
    written = write_converter_gguf(tmp_path / "freqs.gguf", shape=shape,
                                   extra={"rope_freqs.weight": factors})
    ids = sample_ids(written.vocab, 12)
    model, _ = load_gguf_model(written.path, "cpu", torch.float32)
    with torch.inference_mode():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    ours = _chain(written.path, [0, 1, 2], ids)
    assert np.abs(ours - ref).max() <= TOL * max(1.0, float(np.abs(ref).max()))
    assert np.abs(_chain(written.path, [0, 1, 2], ids, factors=False) - ref).max() > 0.1
