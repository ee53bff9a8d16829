"""What if I bought X: the device catalogue, fit on a catalogue device, predictions, η
provenance, support verdicts, the CLI. Real fit planner, real SQLite, real CLI subprocesses;
the catalogue and the published measurements are shipped data, checked here for sources and
units, and predictions are recomputed by hand (and the class fit by numpy's own least
squares)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from strata.errors import InputError
from strata.fit.plan import FitOptions, fit_model
from strata.hardware.catalogue import device_files, find_device, load_catalogue, problems
from strata.hardware.profile import HostProfile
from strata.models.source import resolve
from strata.whatif.device import Hosting
from strata.whatif.plan import device_fit, parse_on, whatif_row
from strata.whatif.provenance import Evidence
from strata.whatif.published import fit_published, load_rows, points_of, shipped_fit
from strata.whatif.support import support
from tests.conftest import run_cli

FIXTURES = Path(__file__).parent / "fixtures"
MODEL = "synthetic:llama-3.1-8b@q4_k_m"


def recorded(path: Path) -> HostProfile:
    return HostProfile.from_dict(json.loads(path.read_text()))


# -- the catalogue ---------------------------------------------------------------------------

def test_every_figure_has_a_source_and_a_plausible_unit() -> None:
    raw = [d for f in device_files() for d in json.loads(f.read_text())["devices"]]
    assert len(raw) >= 40
    bad = [p for d in raw for p in problems(d)]
    assert bad == []
    ids = [d["id"] for d in raw]
    assert len(ids) == len(set(ids)), "duplicate ids"
    classes = {d.device_class for d in load_catalogue()}
    assert {"nvidia-gpu", "nvidia-hbm", "amd-gpu", "apple", "intel-gpu", "cpu"} <= classes


def test_the_schema_check_catches_a_missing_source_and_a_unit_slip() -> None:
    good = json.loads(device_files()[0].read_text())["devices"][0]
    assert problems(good) == []
    unsourced = {**good, "sources": {k: v for k, v in good["sources"].items()
                                     if k != "bandwidth_gbs"}}
    assert any("bandwidth_gbs has no source" in p for p in problems(unsourced))
    tbs = {**good, "bandwidth_gbs": 1.008}  # TB/s typed where GB/s belongs
    assert any("outside" in p for p in problems(tbs))
    cpu = next(d for f in device_files() for d in json.loads(f.read_text())["devices"]
               if d["kind"] == "cpu")
    assert any("channels" in p for p in problems({**cpu, "bandwidth_gbs": cpu["bandwidth_gbs"]
                                                  * 2}))


@pytest.mark.parametrize(("typed", "want"), [
    ("rtx-4090", "rtx-4090"), ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("4090", "rtx-4090"),
    ("RX 9070 XT", "rx-9070-xt"), ("m3 max 30-core", "m3-max-30c"),
])
def test_devices_are_found_by_id_name_and_alias(typed: str, want: str) -> None:
    assert find_device(typed).id == want


def test_a_bad_name_is_one_line_with_close_matches() -> None:
    with pytest.raises(InputError) as e:
        find_device("rtx 409")
    assert "close: rtx-4090" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(InputError, match="names several devices") as e:
        find_device("a100")  # three A100s: never a silent pick
    assert all(d in str(e.value) for d in ("a100-pcie-40gb", "a100-pcie-80gb", "a100-sxm-80gb"))
    with pytest.raises(InputError, match="names several devices"):
        find_device("h100")  # PCIe 2.0 TB/s or SXM 3.35 TB/s
    assert parse_on("m3-max-40c:48").memory_gib == 48
    with pytest.raises(InputError):
        parse_on("m3-max-40c:lots")


def test_every_published_row_names_a_catalogue_device_and_a_source() -> None:
    rows, skipped = load_rows()
    assert len(rows) >= 100
    assert all(r.source.strip() and r.tps > 0 for r in rows)
    assert {r.split for r in rows} <= {"fit", "holdout", "excluded"}
    assert len(skipped) <= 5, skipped  # a device the catalogue lacks is said, not dropped


# -- fit on a catalogue device = fit on a recorded probe of the same device -------------------

@pytest.mark.parametrize(("fixture", "device", "exact"), [
    (FIXTURES / "probes" / "rdna4_rx9070xt_torch25_rocm62.json", "rx-9070-xt", True),
    (FIXTURES / "fit" / "rtx4090_24gb.json", "rtx-4090", False),
])
@pytest.mark.parametrize("ref", [MODEL, "synthetic:qwen3-8b@q8_0",
                                 "synthetic:llama-3.1-70b@q4_k_m"])
def test_fit_on_a_catalogue_device_equals_fit_on_its_recorded_probe(
        fixture: Path, device: str, exact: bool, ref: str) -> None:
    profile = recorded(fixture)
    model, options = resolve(ref), FitOptions(ctx=8192)
    probed = fit_model(model, profile, options)
    gpu = next(r for r in probed.rows if r.budget.kind == "gpu")
    hosting = Hosting(profile.cpu.ram_available_bytes or 0, profile.cpu)
    _, row = device_fit(model, find_device(device), options, hosting)
    assert (row.verdict, row.placement.to_dict()) == (gpu.verdict, gpu.placement.to_dict())
    assert row.quants == gpu.quants
    if exact:  # the recording holds exactly 16 GiB: every figure is the same
        assert (row.budget.available, row.max_ctx) == (gpu.budget.available, gpu.max_ctx)
    else:  # NVML reports 12 MiB less than the 24 GiB the datasheet says: contexts differ a bit
        assert row.budget.available - gpu.budget.available == 12 * 2**20
        if gpu.max_ctx:
            assert 0 <= row.max_ctx - gpu.max_ctx <= 256


# -- predictions, by hand -------------------------------------------------------------------

def _streamed_bytes_by_hand(ref: str) -> int:
    """Every tensor's bytes except the token table, of which a token reads one row."""
    spec = resolve(ref).spec
    return sum(t.nbytes for t in spec.tensors if t.name != "token_embd.weight")


def test_the_class_fit_is_numpy_least_squares_on_the_fit_rows() -> None:
    rows, _ = load_rows()
    points, _ = points_of([r for r in rows if r.split == "fit"])
    mine = [p for p in points if p.row.device.device_class == "nvidia-gpu"
            and p.row.phase == "decode"]
    slope, intercept = np.polyfit([p.ideal_s for p in mine], [p.measured_s for p in mine], 1)
    fit = shipped_fit().get("nvidia-gpu", "decode")
    assert fit is not None and fit.n == len(mine)
    assert fit.eta == pytest.approx(1 / slope, rel=1e-9)
    assert fit.c_s == pytest.approx(intercept, rel=1e-9)


def test_decode_on_two_devices_recomputed_by_hand() -> None:
    options, hosting = FitOptions(ctx=4096), Hosting(64 * 2**30)
    evidence = Evidence(shipped_fit())
    model = resolve(MODEL)
    # KV read per decoded token of tg128: K and V, 32 layers, 8 KV heads x 128, f16, at the
    # mean context of the test (64 tokens)
    kv = 2 * 32 * 8 * 128 * 2 * 64
    weights = _streamed_bytes_by_hand(MODEL)
    # RTX 4090: published NVIDIA GDDR fit, t = x/η + c
    rtx = whatif_row(model, find_device("rtx-4090"), options, hosting, evidence, {})
    fit = shipped_fit().get("nvidia-gpu", "decode")
    x = (weights + kv) / 1008e9
    tg = next(p for p in rtx.predictions if p.test == "tg128")
    assert tg.tps == pytest.approx(1 / (x / fit.eta + fit.c_s), rel=1e-6)
    assert "published" in tg.eta.basis
    # EPYC 9654: no published CPU figures: the prior η 0.7, no per-token cost;
    # 12 channels x 8 B x 4800 MT/s = 460.8 GB/s
    epyc = whatif_row(model, find_device("epyc-9654"), options, hosting, evidence, {})
    tg = next(p for p in epyc.predictions if p.test == "tg128")
    assert tg.tps == pytest.approx(0.7 * 460.8e9 / (weights + kv), rel=1e-6)
    assert tg.eta.basis.startswith("prior")
    assert (tg.low_tps, tg.high_tps) == pytest.approx((tg.tps * 5 / 7, tg.tps * 9 / 7))


def test_a_model_that_does_not_fit_gets_no_speed_and_says_why() -> None:
    row = whatif_row(resolve("synthetic:llama-3.1-70b@q4_k_m"), find_device("rtx-4060"),
                     FitOptions(), Hosting(32 * 2**30), Evidence(shipped_fit()), {})
    assert row.predictions == [] and "not modelled" in row.absent[0]


def test_price_and_power_divide_the_decode_rate() -> None:
    dev = find_device("rtx-4090")
    row = whatif_row(resolve(MODEL), dev, FitOptions(), Hosting(64 * 2**30),
                     Evidence(shipped_fit()), {"rtx-4090": 2000.0})
    tg = row.tps("decode")
    assert row.tps_per_kusd == pytest.approx(tg / 2)
    assert row.tps_per_watt == pytest.approx(tg / dev.tdp_w)


# -- where η comes from ----------------------------------------------------------------------

def _db_with_a_4090_result(tmp_path: Path, decode_tps: float) -> object:
    from strata.bench.explain import explain
    from strata.bench.scenario import BenchTest
    from strata.store.db import open_db
    from strata.store.hosts import save_host
    from strata.store.runs import StoredResult, add_result, start_run
    from strata.whatif.device import roofline

    conn = open_db(tmp_path / "r.db")
    profile = recorded(FIXTURES / "fit" / "rtx4090_24gb.json")
    fp = save_host(conn, profile)
    spec = resolve(MODEL).spec
    ex = explain(spec, BenchTest(0, 128), roofline(find_device("rtx-4090")), "f16", None,
                 achieved={"decode_tps": decode_tps}).to_dict()
    ex["device"] = "cuda:0"
    run = start_run(conn, fp, "bench", [], {})
    add_result(conn, run, StoredResult(MODEL, "llamacpp", "tg128", 0, 128, 0, {},
                                       {"decode_tps": {"mean": decode_tps}}, ex, None, {}))
    return conn


def test_eta_comes_from_this_db_first_then_the_architecture_then_published(
        tmp_path: Path) -> None:
    from strata.whatif.provenance import db_points

    conn = _db_with_a_4090_result(tmp_path, 100.0)
    evidence = Evidence(shipped_fit(), db_points(conn))
    same = evidence.speed(find_device("rtx-4090"), "decode")
    assert same.tier == "this device in the DB" and len(same.sources) == 1
    # one result: η = x / measured seconds, no per-token cost
    x = same.sources[0].eta / 100.0  # η = x·tps
    assert same.tps(x) == pytest.approx(100.0)
    family = evidence.speed(find_device("rtx-4080"), "decode")  # sm_89 too
    assert family.tier == "same architecture in the DB"
    other = evidence.speed(find_device("rtx-3090"), "decode")
    assert other.tier == "published"
    # no AMD row is fitted: the other vendor's class of the same memory technology, with at
    # least the prior's spread; a CPU platform has no such class: the prior
    gddr, hbm = (evidence.speed(find_device(d), "decode") for d in ("rx-7900-xtx", "mi300x"))
    assert gddr.tier == hbm.tier == "published, other vendor"
    assert "nvidia-gpu" in gddr.basis and "nvidia-hbm" in hbm.basis
    assert gddr.low <= 5 / 7 and gddr.high >= 9 / 7
    assert evidence.speed(find_device("epyc-9654"), "decode").tier == "prior"
    row = whatif_row(resolve(MODEL), find_device("rtx-4090"), FitOptions(),
                     Hosting(64 * 2**30), evidence, {})
    assert row.record()["decode_eta_basis"].startswith("this device in the DB")


# -- support ---------------------------------------------------------------------------------

def test_rdna4_with_rocm62_is_refused_and_the_working_stack_is_named() -> None:
    for dev in ("rx-9060-xt-16gb", "rx-9070-xt"):  # gfx1200 and gfx1201
        s = support(find_device(dev))
        assert [stack for stack, _ in s.fails] == ["torch 2.5.1+rocm6.2"]
        assert "invalid device function" in s.fails[0][1]
        assert s.works == ["torch 2.12.1+rocm7.2"]
    assert support(find_device("rx-7900-xtx")).fails == []  # gfx1100 is in both wheels
    assert not support(find_device("rtx-5090")).fails[-1][0].endswith("cu128")


# -- sweep and validation --------------------------------------------------------------------

def test_more_channels_decode_faster_and_more_memory_runs_larger_models() -> None:
    from strata.whatif.sweep import sweep

    dev = find_device("threadripper-7980x")
    variants = sweep([resolve(MODEL)], dev, FitOptions(), Hosting(64 * 2**30),
                     Evidence(shipped_fit()), "q4_k_m")
    channels = [v for v in variants if " ch " in v.label]
    assert [v.label.split(" ch")[0] for v in channels] == ["2", "8", "12"]  # its own 4: below
    assert all("DDR5-5200" in v.label for v in channels)
    rates = [v.rows[0].tps("decode") for v in channels]
    assert rates == sorted(rates) and rates[-1] > 5 * rates[0]  # 12 channels vs 2
    sizes = [v for v in variants if " ch " not in v.label]
    assert any("(this device)" in v.label for v in sizes)
    small = replace(dev, memory_gib=8.0)
    assert sizes and all(v.largest for v in sizes)
    from strata.whatif.sweep import largest_preset, presets_by_size

    assert largest_preset(small, presets_by_size("q4_k_m"), FitOptions(), Hosting(0)) \
        != sizes[-1].largest


def test_validation_predicts_only_held_out_rows() -> None:
    from strata.whatif.validate import check, summarise

    checked = check()
    assert checked and all(c.row.split == "holdout" for c in checked)
    c = checked[0]
    assert c.error == pytest.approx(abs(c.predicted_tps / c.row.tps - 1))
    assert {s.device_class for s in summarise(checked) if s.phase == "decode"} >= {
        "nvidia-gpu", "apple"}
    # refitting with the held-out rows changes nothing about which rows were fitted
    assert fit_published().get("apple", "decode") == shipped_fit().get("apple", "decode")


# -- the CLI ---------------------------------------------------------------------------------

def test_cli_whatif_json_fit_on_and_errors(tmp_path: Path) -> None:
    from tests.test_output_schema import check

    proc = run_cli("whatif", MODEL, "--on", "rtx-4090", "--on", "rx-9070-xt", "--price",
                   "rtx-4090=1599", "-o", "json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    recs = {r["device"]: r for r in doc["rows"]}
    assert set(recs) == {"rtx-4090", "rx-9070-xt"}
    for rec in recs.values():
        check(rec, "whatif")  # every field documented in docs/output.md, typed so
    assert recs["rtx-4090"]["decode_ts_per_kusd"] > 0 and recs["rx-9070-xt"]["price_usd"] is None
    assert "rocm6.2" in recs["rx-9070-xt"]["support"]
    fit = run_cli("fit", MODEL, "--on", "rtx-4090", "-o", "json", home=tmp_path)
    assert fit.returncode == 0, fit.stderr
    fdoc = json.loads(fit.stdout)
    assert [d["device"] for d in fdoc["devices"]] == ["rtx-4090"]
    assert fdoc["predictions"][0]["predicted_ts"] > 0
    bad = run_cli("whatif", MODEL, "--on", "rtx 409", home=tmp_path)
    assert bad.returncode == 2 and "close: rtx-4090" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    price = run_cli("whatif", MODEL, "--on", "rtx-4090", "--price", "rtx-4090=free",
                    home=tmp_path)
    assert price.returncode == 2 and "DEVICE=USD" in price.stderr
    (tmp_path / "prices.txt").write_text("# what I was quoted\nrtx-4090, 1800\nrx-9070-xt=600\n")
    filed = run_cli("whatif", MODEL, "--on", "rtx-4090", "--on", "rx-9070-xt", "--prices",
                    str(tmp_path / "prices.txt"), "--price", "rtx-4090=1599", "-o", "json",
                    home=tmp_path)
    assert filed.returncode == 0, filed.stderr
    paid = {r["device"]: r["price_usd"] for r in json.loads(filed.stdout)["rows"]}
    assert paid == {"rtx-4090": 1599.0, "rx-9070-xt": 600.0}  # the flag wins over the file
    missing = run_cli("whatif", MODEL, "--prices", str(tmp_path / "nope.json"), home=tmp_path)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    listed = run_cli("whatif", "--list", "-o", "json", home=tmp_path)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)) >= 40


def test_report_sets_this_hosts_measured_rate_beside_the_devices_asked(tmp_path: Path) -> None:
    from strata.report import build_report
    from strata.store.hosts import list_hosts

    conn = _db_with_a_4090_result(tmp_path, 100.0)
    fp = list_hosts(conn)[0].fingerprint
    plain = build_report(conn, fp, planner=None)
    assert "whatif" not in [s.id for s in plain.sections]  # only when devices are asked for
    report = build_report(conn, fp, planner=None, on=("rtx-5090", "m4-max-40c"))
    section = report.section("whatif")
    assert section.has_data
    assert "rtx-5090" in section.body and "m4-max-40c" in section.body
    assert "100.0" in section.body  # this host's measured tg t/s beside the predictions
    with pytest.raises(InputError):
        from strata.commands.report import run_report

        run_report(conn, tmp_path / "r.html", fp, on=("rtx 409",))
    assert not (tmp_path / "r.html").exists()


def test_a_unified_memory_holds_the_gpu_part_and_the_cpu_part_together() -> None:
    """A 36 GiB Mac: Metal may wire 27 GiB; a 70B Q4_K_M (40 GiB) split 27 + 16 GiB does
    not fit in 36, whatever fit says of each part alone."""
    options, hosting = FitOptions(), Hosting(2**40)  # --ram cannot rescue a unified chip
    _, row = device_fit(resolve("synthetic:llama-3.1-70b@q4_k_m"), parse_on("m4-max-32c:36"),
                        options, hosting)
    assert row.verdict == "does not fit" and "unified memory holds both" in row.reason
    _, small = device_fit(resolve("synthetic:llama-3.1-8b@f16"), find_device("m1-8c"),
                          options, hosting)
    assert small.verdict == "does not fit"
    _, whole = device_fit(resolve(MODEL), find_device("m4-max-40c"), options, hosting)
    assert whole.verdict == "fits"


def test_flash_attention_sizes_the_context_a_gpu_holds() -> None:
    """llama.cpp's -fa auto (on): no per-head score matrix, so the 8B model keeps its full
    128K context in 24 GiB; with -fa 0 the scores eat into it."""
    from strata.commands.whatif import options_for

    dev, hosting, model = find_device("rtx-4090"), Hosting(64 * 2**30), resolve(MODEL)
    _, on = device_fit(model, dev, options_for(None, None, True), hosting)
    _, off = device_fit(model, dev, options_for(None, None, False), hosting)
    assert on.max_ctx == 131072 and on.max_ctx_is_model_limit
    assert off.max_ctx < on.max_ctx
