"""strata ring plan: members, links and the partition, checked against hand-computed plans.

Expected bytes come from the presets' shapes by hand (the float32 files: held as stored),
never from the code under test; a brute-force search over every member order and every split
is the oracle for the dynamic programme. Everything runs on metadata (nothing is written) and
loopback sockets, in seconds.
"""

from __future__ import annotations

import itertools
import json
import random
import socket
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from strata.cli import app
from strata.errors import InputError
from strata.models.spec import ModelSpec, TensorInfo
from strata.ring.plan.links import Link, LinkProbeServer, measure_link, parse_link, serve_link_probe
from strata.ring.plan.members import Member, capped, emulated, from_document
from strata.ring.plan.partition import DRIVER_MS, HOP_MS, plan_ring
from strata.ring.plan.types import RingPlan, size
from tests.conftest import RING_SECRET, run_cli
from tests.test_output_schema import SCHEMAS, check

# -- hand arithmetic for the tiny presets (float32, src/strata/models/data/presets.json) -----
# tiny: hidden 64, ffn 128, 2 layers, 4 heads, 2 KV heads of 16, vocab 512, untied head.
H, FFN, KVD, VOCAB = 64, 128, 2 * 16, 512
TINY_BLOCK = 4 * (H * H + 2 * H * KVD + H * H + 3 * FFN * H + 2 * H)  # q,k,v,o, gate/up/down,
# two norms: 147968 B
CTX = 256
KV_BLOCK = 2 * KVD * CTX * 4  # K and V of one layer at 256 tokens: 65536 B
EMBD = 4 * VOCAB * H  # token_embd: 131072 B (one 256 B row read per token)
HEAD = 4 * VOCAB * H + 4 * H  # output.weight + output_norm: 131328 B
FIRST = TINY_BLOCK + KV_BLOCK + EMBD  # share of the stage holding layer 0: 344576 B
LAST = TINY_BLOCK + KV_BLOCK + HEAD  # share of the stage holding layer 1: 344832 B
WHOLE = 2 * (TINY_BLOCK + KV_BLOCK) + EMBD + HEAD  # 689408 B


def member(mid: str, offered: int, bw: float | None = 1e9, eta: float | None = 1.0) -> Member:
    return Member(id=mid, host="", port=0, device="cpu", available_bytes=offered,
                  mem_cap_bytes=None, bandwidth_Bps=bw, flops=None, strata_version="t",
                  epoch=0, decode_eta=eta)


def offering(usable: int) -> int:
    """The memory a member must offer for usable_bytes == usable (int(0.9 x offered))."""
    offered = int(usable / 0.9)
    while int(0.9 * offered) < usable:
        offered += 1
    return offered


def within_headroom(plan: RingPlan, members: list[Member]) -> None:
    by_id = {m.id: m for m in members}
    for s in plan.stages:
        assert s.bytes <= 0.9 * by_id[s.member].offered_bytes
    assert plan.stages[0].first == 0
    assert all(a.last == b.first for a, b in itertools.pairwise(plan.stages))


def test_the_hand_arithmetic_matches_the_preset() -> None:
    assert (TINY_BLOCK, KV_BLOCK, FIRST, LAST, WHOLE) == (147968, 65536, 344576, 344832, 689408)


# -- plans ------------------------------------------------------------------------------------


def test_two_nodes_when_one_alone_cannot_hold_it() -> None:
    cap = 500_000  # 0.9 x 500 kB = 450 kB: one layer and an end each, not the whole 689 kB
    members = [member("a", cap), member("b", cap)]
    plan = plan_ring("synthetic:tiny@f32", members, CTX)
    assert [(s.member, s.first, s.last, s.bytes) for s in plan.stages] == [
        ("a", 0, 1, FIRST), ("b", 1, 2, LAST)]
    assert plan.single_node is None and plan.need_bytes == WHOLE
    assert [(h.src, h.dst, h.bytes_per_token, h.carries) for h in plan.links] == [
        ("a", "b", H * 4, "activations"), ("b", "a", VOCAB * 4, "logits")]
    within_headroom(plan, members)


def test_the_share_must_fit_in_nine_tenths_to_the_byte() -> None:
    fits = [member("a", offering(LAST)), member("b", offering(LAST))]
    assert len(plan_ring("synthetic:tiny@f32", fits, CTX).stages) == 2
    short = [member("a", offering(LAST - 1)), member("b", offering(LAST - 1))]
    with pytest.raises(InputError, match="no contiguous split fits"):
        plan_ring("synthetic:tiny@f32", short, CTX)  # together enough, but not the head's stage


def test_fits_alone_picks_the_fastest_member_and_no_links() -> None:
    members = [member("a", 10**9, bw=1e9), member("b", 10**9, bw=5e9, eta=0.5)]
    plan = plan_ring("synthetic:tiny@f32", members, CTX)
    assert plan.single_node == "b" and plan.links == [] and plan.unused == ["a"]
    (stage,) = plan.stages
    assert (stage.first, stage.last, stage.bytes) == (0, 2, WHOLE)
    read = 2 * (TINY_BLOCK + KV_BLOCK) + EMBD // VOCAB + HEAD  # a row of the embedding
    assert stage.read_bytes == read
    # + the driver's own loop per token (no hop: one member)
    assert plan.predicted_ms_per_token == pytest.approx(read / (5e9 * 0.5) * 1e3 + DRIVER_MS)


def test_as_few_members_as_needed_even_when_a_ring_would_be_faster() -> None:
    members = [member("big", 10**9, bw=1e9), member("fast", 400_000, bw=100e9)]
    plan = plan_ring("synthetic:tiny@f32", members, CTX)
    assert plan.single_node == "big" and plan.unused == ["fast"]


def test_cannot_hold_names_the_shortfall() -> None:
    members = [member("a", 300_000), member("b", 300_000)]  # 2 x 270000 usable
    with pytest.raises(InputError) as err:
        plan_ring("synthetic:tiny@f32", members, CTX)
    missing = WHOLE - 2 * 270_000
    assert f"{size(missing)} missing" in str(err.value)  # 145.91 KiB
    assert f"needs {size(WHOLE)}" in str(err.value)


def test_the_faster_member_takes_the_head() -> None:
    # Stage reads: first = block + KV + one embedding row (213760 B), last = block + KV +
    # the whole head (344832 B): the heavier end belongs on the faster member.
    cap = 500_000
    slow_a = plan_ring("synthetic:tiny@f32", [member("a", cap, 1e9), member("b", cap, 4e9)], CTX)
    fast_a = plan_ring("synthetic:tiny@f32", [member("a", cap, 4e9), member("b", cap, 1e9)], CTX)
    assert [s.member for s in slow_a.stages] == ["a", "b"]
    assert [s.member for s in fast_a.stages] == ["b", "a"]  # not the id order: the speed
    first_read = TINY_BLOCK + KV_BLOCK + EMBD // VOCAB
    last_read = TINY_BLOCK + KV_BLOCK + HEAD
    assert fast_a.predicted_stages_ms == pytest.approx((first_read / 1e9 + last_read / 4e9) * 1e3)


def test_the_links_choose_the_pair_and_count_in_the_time() -> None:
    cap = 500_000
    members = [member("a", cap), member("b", cap), member("c", cap)]
    slow, quick = Link(10e-3, 1e6), Link(0.1e-3, 100e6)
    links = {("a", "b"): slow, ("b", "c"): slow, ("c", "a"): quick}
    plan = plan_ring("synthetic:tiny@f32", members, CTX, links)
    assert {s.member for s in plan.stages} == {"a", "c"} and plan.unused == ["b"]
    hops = (0.1e-3 / 2 + H * 4 / 100e6) + (0.1e-3 / 2 + VOCAB * 4 / 100e6)
    stages = (TINY_BLOCK + KV_BLOCK + EMBD // VOCAB + TINY_BLOCK + KV_BLOCK + HEAD) / 1e9
    assert plan.predicted_ms_per_token == pytest.approx((stages + hops) * 1e3 + DRIVER_MS
                                                        + 2 * HOP_MS)
    assert [h.rtt_ms for h in plan.links] == [pytest.approx(0.1)] * 2


def toy(blocks: list[int], *, head: int = 160, experts: list[int] | None = None,
        n_experts: int = 0, used: int = 0) -> ModelSpec:
    """A model of made-up sizes (stored bytes, planned as stored): KV 8 B per token per
    block (1 KV head of 1 element, 4 B, K and V), embedding 10 rows of 16 B."""
    tensors = [TensorInfo("token_embd.weight", (10, 4), "F32", 160)]
    for i, nbytes in enumerate(blocks):
        tensors.append(TensorInfo(f"blk.{i}.attn_q.weight", (nbytes // 4,), "F32", nbytes))
        if experts:
            tensors.append(TensorInfo(f"blk.{i}.ffn_up_exps.weight", (experts[i] // 4,),
                                      "F32", experts[i]))
    tensors += [TensorInfo("output_norm.weight", (4,), "F32", 16),
                TensorInfo("output.weight", (10, 4), "F32", head)]
    return ModelSpec("toy", "llama", len(blocks), 1, 1, 1, 4, 8, 10, 100, False, tensors,
                     n_experts=n_experts, n_experts_used=used, expert_ffn=1 if n_experts else 0)


def test_three_nodes_hand_computed() -> None:
    # Blocks of 100 B + 80 B of KV at ctx 10 (180 B each); the head stage holds 416 B more,
    # the first 160 B. Usable 600 B each: the last stage takes 1 block, the first <= 2, the
    # middle <= 3: sizes (2, 3, 1) are forced. Bytes read: first 16 + 360 = 376, middle 540,
    # last 180 + 416 = 596; speeds 6, 3, 1 GB/s: the heaviest on the fastest gives
    # 596/6 + 540/3 + 376/1 = 655.3 ns (a in the middle instead: 664.7 ns).
    spec = toy([100] * 6, head=400)
    members = [member(m, offering(600), bw) for m, bw in (("a", 6e9), ("b", 3e9), ("c", 1e9))]
    plan = plan_ring(spec, members, 10, weights_dtype=None)
    assert [(s.member, s.first, s.last, s.bytes) for s in plan.stages] == [
        ("c", 0, 2, 520), ("b", 2, 5, 540), ("a", 5, 6, 596)]
    assert plan.predicted_stages_ms == pytest.approx((596 / 6 + 540 / 3 + 376) * 1e-6)
    within_headroom(plan, members)


def test_moe_memory_counts_every_expert_and_time_the_used_ones() -> None:
    # 2 blocks: 100 B shared + 800 B of experts (8 experts, 2 per token) + 80 B KV at ctx 10
    spec = toy([100, 100], experts=[800, 800], n_experts=8, used=2)
    members = [member("a", offering(1200)), member("b", offering(1200))]
    plan = plan_ring(spec, members, 10, weights_dtype=None)
    first, last = plan.stages
    assert (first.first, first.last, first.bytes) == (0, 1, 160 + 980)  # all 8 experts held
    assert (last.first, last.last, last.bytes) == (1, 2, 176 + 980)
    assert first.read_bytes == 16 + 100 + 200 + 80  # 2 of 8 experts' bytes read
    assert last.read_bytes == 176 + 100 + 200 + 80
    assert any("experts stay with it" in n for n in plan.notes)


def test_moe_preset_experts_stay_with_their_layer() -> None:
    # tiny-moe in float32: per layer 12960 shared parameters (attention, norms, router) and
    # 3 x 8 x 64 x 64 expert parameters, 2 of 8 experts read per token.
    shared, experts = 4 * 12960, 4 * 3 * 8 * 64 * 64
    cap = offering(shared + experts + KV_BLOCK + HEAD)
    plan = plan_ring("synthetic:tiny-moe@f32", [member("a", cap), member("b", cap)], CTX)
    assert [s.bytes for s in plan.stages] == [shared + experts + KV_BLOCK + EMBD,
                                              shared + experts + KV_BLOCK + HEAD]
    assert plan.stages[1].read_bytes == shared + experts // 4 + KV_BLOCK + HEAD


def brute_force(spec: ModelSpec, members: list[Member], ctx: int,
                links: dict[tuple[str, str], Link]) -> tuple[int, float] | None:
    """(members used, seconds per token) of the best plan by trying everything."""
    n = spec.n_layers
    block = [sum(t.nbytes for t in spec.tensors if t.name.startswith(f"blk.{i}."))
             for i in range(n)]
    kv = 8 * ctx
    for k in range(1, len(members) + 1):
        best = None
        for order in itertools.permutations(members, k):
            hops = list(itertools.pairwise(order)) + ([(order[-1], order[0])] if k > 1 else [])
            link_s = sum((links[(a.id, b.id)] if (a.id, b.id) in links else links[(b.id, a.id)])
                         .one_way_s(4 * 4 if (a, b) != hops[-1] else 10 * 4) + HOP_MS / 1e3
                         for a, b in hops) if k > 1 else 0.0
            link_s += DRIVER_MS / 1e3
            for cuts in itertools.combinations(range(1, n), k - 1):
                bounds = list(zip((0, *cuts), (*cuts, n), strict=True))
                total, ok = link_s, True
                for j, (m, (lo, hi)) in enumerate(zip(order, bounds, strict=True)):
                    mem = sum(block[lo:hi]) + kv * (hi - lo)
                    read = mem + (16 if j == 0 else 0) + (176 if j == k - 1 else 0)
                    mem += (160 if j == 0 else 0) + (176 if j == k - 1 else 0)
                    ok &= mem <= m.usable_bytes
                    total += read / m.bandwidth_Bps
                if ok and (best is None or total < best):
                    best = total
        if best is not None:
            return k, best
    return None


def test_the_search_finds_what_brute_force_finds() -> None:
    rng = random.Random(15)
    for _ in range(60):
        spec = toy([rng.randrange(40, 400, 4) for _ in range(rng.randint(1, 5))])
        members = [member(f"m{i}", rng.randint(300, 1500), rng.choice([1e9, 2e9, 5e9]))
                   for i in range(rng.randint(1, 3))]
        links = {(a.id, b.id): Link(rng.uniform(0, 1e-6), rng.choice([1e9, 4e9]))
                 for a, b in itertools.combinations(members, 2)}
        want = brute_force(spec, members, 10, links)
        if want is None:
            with pytest.raises(InputError):
                plan_ring(spec, members, 10, links, return_bytes=40, weights_dtype=None)
            continue
        plan = plan_ring(spec, members, 10, links, return_bytes=40, weights_dtype=None)
        assert len(plan.stages) == want[0]
        assert plan.predicted_ms_per_token == pytest.approx(want[1] * 1e3, rel=1e-9)
        within_headroom(plan, members)


def test_a_search_cut_short_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import strata.ring.plan.partition as ring_plan

    monkeypatch.setattr(ring_plan, "MAX_ORDERS", 1)
    members = [member("a", 500_000), member("b", 500_000)]
    plan = plan_ring("synthetic:tiny@f32", members, CTX)
    assert any("a faster order may exist" in n for n in plan.notes)


def test_a_q8_0_file_is_planned_as_stored_and_as_float32_for_torch_ops() -> None:
    """Lab stages hold the GGUF's blocks: a q8_0 block is 34 bytes for 32 weights (norms stay
    float32); torch stages hold float32 (the hand arithmetic of the f32 file)."""
    q8 = 34 * (H * H + 2 * H * KVD + H * H + 3 * FFN * H) // 32 + 4 * 2 * H
    embd, head = 34 * VOCAB * H // 32, 34 * VOCAB * H // 32 + 4 * H
    big = [member("big", 10**9)]
    (whole,) = plan_ring("synthetic:tiny@q8_0", big, CTX).stages
    assert whole.weight_bytes == 2 * q8 + embd + head
    (f32,) = plan_ring("synthetic:tiny@q8_0", big, CTX, weights_dtype="float32").stages
    assert f32.weight_bytes + f32.kv_bytes == WHOLE
    out = CliRunner().invoke(app, ["ring", "plan", "synthetic:tiny@q8_0", "--node", "a:1",
                                   "--ops", "torch", "-o", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["stages"][0]["weights_bytes"] == WHOLE - 2 * KV_BLOCK


def test_the_plan_sizes_shares_as_the_stages_hold_them() -> None:
    """The planner's bytes are the runtime's (strata.ring.runtime.stage: as stored for lab ops,
    float32 for torch ops, a tied head's copy on the last stage): a plan that fits is a stage
    that loads."""
    stage = pytest.importorskip("strata.ring.runtime.stage")
    from strata.models.source import resolve

    for ref in ("synthetic:tiny@q8_0", "synthetic:tiny-qwen2@f32", "synthetic:tiny-qwen2@q8_0"):
        spec = resolve(ref).spec
        assert spec is not None
        caps = [member("a", 400_000), member("b", 400_000)]
        for plan in (plan_ring(ref, [member("big", 10**9)], CTX), plan_ring(ref, caps, CTX)):
            for s in plan.stages:
                assert stage.stage_bytes(spec, s.first, s.last, CTX) == (s.weight_bytes,
                                                                         s.kv_bytes)
        # a float16 cache (ring run --kv-type f16): half the KV bytes, counted by the plan
        for s in plan_ring(ref, caps, CTX, kv_elem_bytes=2).stages:
            weights, kv = stage.stage_bytes(spec, s.first, s.last, CTX, kv="f16")
            assert (weights, kv) == (s.weight_bytes, s.kv_bytes) and kv > 0
            assert 2 * kv == stage.stage_bytes(spec, s.first, s.last, CTX)[1]
    # a q8_0 cache (ring run --kv-type q8_0): 34 bytes per 32 values, on heads of 64
    ref = "synthetic:tiny-k@q8_0"
    spec = resolve(ref).spec
    assert spec is not None and spec.head_dim == 64
    caps = [member("a", 10**8), member("b", 10**8)]
    for s in plan_ring(ref, caps, CTX, kv_elem_bytes=34 / 32).stages:
        weights, kv = stage.stage_bytes(spec, s.first, s.last, CTX, kv="q8_0")
        assert (weights, kv) == (s.weight_bytes, s.kv_bytes) and kv > 0
        assert 64 * kv == 34 * stage.stage_bytes(spec, s.first, s.last, CTX)[1] // 2


# -- members and links ------------------------------------------------------------------------


def test_member_wire_form_round_trips_and_refuses_garbage() -> None:
    m = capped(emulated("pi5:8:17"), 2 * 2**30)
    assert (m.available_bytes, m.bandwidth_Bps, m.offered_bytes) == (8 * 2**30, 17e9, 2 * 2**30)
    assert m.usable_bytes == int(0.9 * 2 * 2**30)
    wire = json.loads(json.dumps(m.to_dict()))
    assert Member.from_dict({**wire, "from_the_future": 1}) == m
    assert from_document({"members": [wire]}, "f") == [m]
    status = {"self": wire, "peers": [{"state": "live", "member": {**wire, "id": "b"}},
                                      {"state": "lost", "member": {**wire, "id": "c"}}]}
    assert [x.id for x in from_document(status, "s")] == ["pi5", "b"]
    with pytest.raises(InputError, match="missing field available_bytes"):
        Member.from_dict({k: v for k, v in wire.items() if k != "available_bytes"})
    with pytest.raises(InputError, match="bandwidth_Bps"):
        Member.from_dict({**wire, "bandwidth_Bps": -1})
    with pytest.raises(InputError, match="NAME:GiB"):
        emulated("pi5")


def test_local_member_reads_memory_and_the_roofline() -> None:
    from strata.host import _profile
    from strata.measure.roofline import DeviceRoofline, Figure, Roofline

    roof = Roofline([DeviceRoofline("cpu", "x", bandwidth={"triad": Figure(20.0, "t")},
                                    compute={"fp32": Figure(100.0, "m")})], 1.0)
    profile = _profile()
    m = Member.local(name="me", port=7, mem_cap_bytes=2**20, profile=profile, roofline=roof)
    assert (m.id, m.port, m.bandwidth_Bps, m.flops) == ("me", 7, 20e9, 100e9)
    assert m.available_bytes == profile.cpu.ram_available_bytes and m.offered_bytes == 2**20
    assert Member.local(profile=profile).bandwidth_Bps is None  # no roofline: unmeasured
    with pytest.raises(InputError, match="no such device"):
        Member.local("cuda:9", profile=profile)


def test_measure_link_over_loopback() -> None:
    with LinkProbeServer() as server:
        link = measure_link(f"127.0.0.1:{server.port}", pings=5, bulk_bytes=1 << 20)
    assert 0 < link.rtt_s < 0.5 and link.bandwidth_Bps > 1e6
    assert len(link.rtt_samples_s) == 5 and Link.from_dict(link.to_dict()) == link
    a, b = socket.socketpair()  # a connection the daemon already holds
    t = threading.Thread(target=serve_link_probe, args=(b,))
    t.start()
    assert measure_link(a, pings=3, bulk_bytes=1 << 16).bandwidth_Bps > 0
    t.join(5)
    a.close()
    b.close()


def test_link_errors_are_one_line() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(InputError, match=f"link 127.0.0.1:{port}: cannot connect"):
        measure_link(f"127.0.0.1:{port}", timeout_s=2)
    assert parse_link("0.3:110") == Link(0.3e-3, 110e6, method="given")
    with pytest.raises(InputError, match="RTT_MS:MB/s"):
        parse_link("fast")


# -- the command ------------------------------------------------------------------------------


def cli(*args: str, home: Path) -> tuple[int, str]:
    """In this process; an InputError (the real CLI's exit 2) comes back as code 2 and its
    message."""
    result = CliRunner().invoke(app, ["ring", "plan", *args], prog_name="strata",
                                env={"STRATA_HOME": str(home), "COLUMNS": "200"})
    if isinstance(result.exception, InputError):
        return 2, str(result.exception)
    return result.exit_code, result.output


def test_cli_two_emulated_nodes_table_and_json(strata_home: Path) -> None:
    nodes = ("--node", "a:0.0004:10", "--node", "b:0.0004:40", "-c", str(CTX))
    code, text = cli("synthetic:tiny@f32", *nodes, "--link", "0.2:1000", home=strata_home)
    assert code == 0, text
    assert "0-0 +embd" in text and "1-1 +head" in text and "t/s at ctx 256" in text
    code, text = cli("synthetic:tiny@f32", *nodes, "--kv-type", "f32", "--json",
                     home=strata_home)
    assert code == 0, text
    doc = json.loads(text)
    check(doc, "ring.plan")
    for s in doc["stages"]:
        check(s, "ring.plan.stages[]")
    for h in doc["links"]:
        check(h, "ring.plan.links[]")
    assert [(s["member"], s["memory_bytes"]) for s in doc["stages"]] == [("a", FIRST),
                                                                         ("b", LAST)]
    assert doc["predicted_ms"] is None  # links not measured, none given: no total
    # ring run's default f16 cache: each share's K and V at 2 bytes an element
    code, text = cli("synthetic:tiny@f32", *nodes, "--json", home=strata_home)
    assert [s["memory_bytes"] for s in json.loads(text)["stages"]] == [
        FIRST - KV_BLOCK // 2, LAST - KV_BLOCK // 2]
    code, text = cli("synthetic:tiny@f32", *nodes, "--kv-type", "q4_0", home=strata_home)
    assert code == 2 and "--kv-type q4_0: choose one of f32, f16, q8_0" in text, text
    # q8_0 blocks hold 32 values: tiny's heads (16) are not whole blocks
    code, text = cli("synthetic:tiny@f32", *nodes, "--kv-type", "q8_0", home=strata_home)
    assert code == 2 and "blocks of 32 values, but this model's heads have 16" in text, text
    code, text = cli("synthetic:tiny@f32", *nodes, "-o", "jsonl", home=strata_home)
    records = [json.loads(line) for line in text.splitlines()]
    for r in records:
        check(r, "ring.plan.records")
    assert [r["link_dst"] for r in records] == ["b", "a"]


def test_cli_three_nodes_and_the_shortfall(strata_home: Path) -> None:
    nodes = ("--node", "a:3:20", "--node", "b:3:10", "--node", "c:3:5")
    # --ops torch: float32 (4.9 GB) needs all three; as stored (lab ops) one would do
    code, text = cli("synthetic:llama-3.2-1b", *nodes, "--link", "0.3:110", "--json",
                     "--ops", "torch", home=strata_home)
    assert code == 0, text
    doc = json.loads(text)
    assert doc["n_nodes"] == 3 and doc["predicted_ts"] > 0
    assert sum(s["n_layers"] for s in doc["stages"]) == 16
    code, text = cli("synthetic:llama-3.2-1b", *nodes, "--mem-cap", "0.3", home=strata_home)
    assert code == 2 and "missing" in text


def test_cli_this_host_alone(strata_home: Path) -> None:
    code, text = cli("synthetic:tiny-moe@f32", home=strata_home)
    assert code == 0, text
    assert "alone: no ring needed" in text and "experts stay with it" in text
    proc = run_cli("ring", "plan", "synthetic:tiny@f32", "--node", "x", home=strata_home)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "NAME:GiB" in proc.stderr


def test_output_document_lists_ring_plan() -> None:
    for name in ("ring.plan", "ring.plan.stages[]", "ring.plan.links[]", "ring.plan.records"):
        assert SCHEMAS.get(name), f"docs/output.md has no {name}"


def test_cli_members_file_with_measured_links(strata_home: Path, tmp_path: Path) -> None:
    a = member("a", 500_000, 1e9).to_dict()
    b = member("b", 500_000, 1e9).to_dict()
    doc = {"members": [a, b],
           "links": [{"src": "b", "dst": "a", "rtt_s": 2e-3, "bandwidth_Bps": 1e8}]}
    path = tmp_path / "ring.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    code, text = cli("synthetic:tiny@f32", "--members", str(path), "-c", str(CTX), "--json",
                     home=strata_home)
    assert code == 0, text
    plan = json.loads(text)
    assert [h["rtt_ms"] for h in plan["links"]] == [pytest.approx(2.0)] * 2  # either way
    hops = (1e-3 + H * 4 / 1e8) + (1e-3 + VOCAB * 4 / 1e8)
    assert plan["predicted_machinery_ms"] == pytest.approx(DRIVER_MS + 2 * HOP_MS)
    assert plan["predicted_ms"] == pytest.approx(plan["predicted_stages_ms"] + hops * 1e3
                                                 + DRIVER_MS + 2 * HOP_MS)
    path.write_text(json.dumps({"members": [{**a, "bandwidth_Bps": "fast"}]}), encoding="utf-8")
    code, text = cli("synthetic:tiny@f32", "--members", str(path), home=strata_home)
    assert code == 2 and str(path) in text


def test_cli_connect_plans_on_the_daemons_live_members(strata_home: Path) -> None:
    from strata.ring.control.wire import Server

    a, b = member("a", 500_000).to_dict(), member("b", 500_000).to_dict()
    status = {"self": a, "peers": [{"state": "live", "member": b},
                                   {"state": "lost", "member": {**b, "id": "gone"}}]}
    server = Server("127.0.0.1", 0, {"status": lambda _msg, _chan: dict(status)},
                    key=RING_SECRET.encode())
    server.serve_in_thread()
    try:
        code, text = cli("synthetic:tiny@f32", "--connect", f"127.0.0.1:{server.port}", "-c",
                         str(CTX), "--json", home=strata_home)
    finally:
        server.stop()
    assert code == 0, text
    plan = json.loads(text)
    assert [s["member"] for s in plan["stages"]] == ["a", "b"] and plan["unused"] == []


# -- measured per-layer times (strata.ring.control.layer_time) replace bandwidth x η ---------------
DEEP_BLOCK = TINY_BLOCK + KV_BLOCK  # tiny-deep: tiny's blocks, 4 of them
DEEP_CAP = offering(3 * DEEP_BLOCK + HEAD)  # 3 blocks and an end, never all 4


def test_measured_layer_times_choose_the_split_over_bandwidth() -> None:
    from strata.ring.plan.types import LayerTime

    members = [member("a", DEEP_CAP, 4e9), member("b", DEEP_CAP, 1e9)]
    by_bytes = plan_ring("synthetic:tiny-deep@f32", members, CTX)
    assert [(s.member, s.n_layers) for s in by_bytes.stages] == [("b", 1), ("a", 3)]
    assert {s.time_source for s in by_bytes.stages} == {"estimated"}
    # Timed: a 3 ms per layer, b 1 ms (depth = ctx: no KV beyond the timed one), head 0.5 ms.
    # (a, b): n_a x 3 + (4 - n_a) x 1 + 0.5 ms, least at n_a = 1: 6.5 ms + a's embedding row
    # at 4 GB/s; (b, a) gives 6.5 ms too but b's row at 1 GB/s: (a 1 layer, b 3 + head) wins.
    timed = {"a": LayerTime(3e-3, 5e-4, CTX, 5), "b": LayerTime(1e-3, 5e-4, CTX, 5)}
    plan = plan_ring("synthetic:tiny-deep@f32", members, CTX, measured=timed)
    assert [(s.member, s.first, s.last) for s in plan.stages] == [("a", 0, 1), ("b", 1, 4)]
    assert [s.time_source for s in plan.stages] == ["measured", "measured"]
    assert [s.layer_ms for s in plan.stages] == pytest.approx([3.0, 1.0])
    row = EMBD // VOCAB
    assert plan.stages[0].predicted_ms == pytest.approx(3.0 + row / 4e9 * 1e3)
    assert plan.stages[1].predicted_ms == pytest.approx(3 * 1.0 + 0.5)
    assert any(n.startswith("stage time measured: a, b (") for n in plan.notes)
    doc = plan.to_json()["stages"]
    assert [(s["time_source"], s["layer_ms"]) for s in doc] == [("measured", 3.0),
                                                                ("measured", 1.0)]


def test_a_member_without_a_timed_layer_keeps_the_estimate() -> None:
    from strata.ring.plan.types import LayerTime

    members = [member("a", DEEP_CAP, 4e9), member("b", DEEP_CAP, None)]
    # b timed at depth 0: a token at ctx also reads each layer's whole KV cache, at b's
    # speed (no bandwidth: the slowest measured one's, a's 4 GB/s); head not timed: its bytes.
    timed = {"b": LayerTime(1e-6, None, 0, 5)}
    plan = plan_ring("synthetic:tiny-deep@f32", members, CTX, measured=timed)
    by = {s.member: s for s in plan.stages}
    assert by["a"].time_source == "estimated" and by["b"].time_source == "measured"
    # a estimated: 213504 B per block at 4 GB/s = 53 µs > b's 1 µs + 65536 B / 4 GB/s = 17 µs
    # ((b, a) with b 3 layers costs the same here: the first order, in id order, is kept)
    assert [(s.member, s.n_layers) for s in plan.stages] == [("a", 1), ("b", 3)]
    assert by["b"].predicted_ms == pytest.approx(
        (3 * (1e-6 + KV_BLOCK / 4e9) + HEAD / 4e9) * 1e3)
    assert by["a"].predicted_ms == pytest.approx((DEEP_BLOCK + EMBD // VOCAB) / 4e9 * 1e3)
    assert any(n == "stage time estimated: a" for n in plan.notes)


def test_timed_members_with_no_bandwidth_anywhere_read_the_rest_at_their_timed_speed() -> None:
    """No member measured a bandwidth (daemons with no roofline yet): the KV cache beyond
    the timed depth is read at the speed the timed layer read its own bytes, not at the
    search's 1 byte/s stand-in (which once predicted 7,424,001 ms for a 0.5 ms token)."""
    from strata.ring.plan.types import LayerTime

    members = [member("a", DEEP_CAP, None), member("b", DEEP_CAP, None)]
    timed = {m.id: LayerTime(1e-4, 2e-5, 16, 5) for m in members}
    plan = plan_ring("synthetic:tiny-deep@f32", members, CTX, measured=timed)
    layers = sum(s.n_layers for s in plan.stages)
    stages_ms = plan.predicted_stages_ms
    assert stages_ms is not None and layers * 0.1 <= stages_ms < 2 * (layers * 0.1 + 0.02)


def test_measured_times_within_noise_are_one_speed() -> None:
    from strata.ring.plan.timing import SAME_SPEED, settle
    from strata.ring.plan.types import LayerTime

    timed = {"a": LayerTime(1.10e-3, 2e-4, 16, 5), "b": LayerTime(1.00e-3, 1e-4, 16, 5),
             "c": LayerTime(1.00e-3 * (1 + SAME_SPEED) * 1.01, None, 16, 5)}
    settled = settle(timed)
    assert settled["a"].layer_s == settled["b"].layer_s == pytest.approx(1.05e-3)
    assert settled["a"].head_s == settled["b"].head_s == pytest.approx(1.5e-4)
    assert settled["c"] == timed["c"]  # more than SAME_SPEED slower than b: its own speed
    # Two members of one machine: noise must not decide the order (ties resolve by id).
    members = [member("a", DEEP_CAP, 1e9), member("b", DEEP_CAP, 1e9)]
    plan = plan_ring("synthetic:tiny-deep@f32", members, CTX,
                     measured={k: timed[k] for k in ("a", "b")})
    assert [s.member for s in plan.stages] == ["a", "b"]
