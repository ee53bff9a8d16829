"""`strata report`: the plotting module, the sections, bad input, and a real headless browser.

The browser test benches a tiny synthetic model for real (llama.cpp + torch, a sweep and a
sustained run), builds the report, loads it in Debian's chromium and checks: no console
messages at all (the page has no scripts, so any message is a problem), a non-blank
screenshot, and every expected section with data points in its charts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from strata.errors import InputError
from strata.hardware.profile import CpuInfo, HostProfile, SoftwareStack, SupportVerdict
from strata.measure.roofline import DeviceRoofline, Figure, Peak, Roofline
from strata.report import EMPTY_DB, build_report
from strata.report.derive import (
    bin_timeline,
    depth_sweeps,
    prompt_sweeps,
    roof_point,
    telemetry_series,
    throttled_times,
    tokens_per_weight_pass,
    varied,
)
from strata.report.fit_table import default_planner
from strata.report.frontier import _table as _frontier_table
from strata.report.frontier import frontier_data, summary_line
from strata.report.html import CSP
from strata.report.svg import (
    Area,
    Chart,
    LinearScale,
    LogScale,
    RefLine,
    Series,
    esc,
    fmt_num,
    linear_domain,
    log_domain,
    nice_step,
    wants_log,
)
from strata.store import open_db
from strata.store.hosts import save_host, save_measurement
from strata.store.runs import StoredResult, add_result, finish_run, query_results, start_run
from tests.conftest import run_cli

HOSTILE = '<script>alert("x")</script>&\'q'

# ---------------------------------------------------------------------------- plotting


def test_linear_scale_maps_and_ticks_nicely() -> None:
    s = LinearScale(0, 10, 100, 200)
    assert s(0) == 100 and s(10) == 200 and s(2.5) == 125
    assert s.ticks(5) == [0, 2, 4, 6, 8, 10]
    assert LinearScale(0, 0.3).ticks(3) == [0, 0.1, 0.2, 0.3]  # no 0.30000000000000004
    y = LinearScale(0, 100, 300, 20)  # a y axis runs upwards
    assert y(0) == 300 and y(100) == 20


def test_nice_step_and_domains() -> None:
    assert [nice_step(v) for v in (0.13, 1.0, 3.2, 7, 45)] == [0.2, 1, 5, 10, 50]
    assert linear_domain([3, 97]) == (0, 100)
    assert linear_domain([5, 5])[0] < 5 < linear_domain([5, 5])[1]  # never an empty domain
    assert linear_domain([2, 8], zero=True)[0] == 0
    assert log_domain([0.3, 250]) == (0.1, 1000)
    assert log_domain([10, 10]) == (1, 100)  # a single value sits mid-axis, not on the frame
    assert log_domain([0, -1]) == (1, 10)  # no positive values: a default, not a crash
    assert log_domain([16, 256], tight=True) == (12.8, 320)  # x axes: no empty decades


def test_log_scale_places_decades_evenly() -> None:
    s = LogScale(1, 1000, 0, 300)
    assert s(1) == 0 and s(10) == pytest.approx(100) and s(1000) == pytest.approx(300)
    assert s.ticks() == [1, 10, 100, 1000]
    assert LogScale(1, 100).ticks() == [1, 2, 5, 10, 20, 50, 100]  # few decades: 2x, 5x too
    many = LogScale(1e-6, 1e12).ticks(5)
    assert len(many) <= 10 and all(t > 0 for t in many)


def test_wants_log_and_fmt_num() -> None:
    assert wants_log([100, 30000]) and not wants_log([100, 200]) and not wants_log([0, 1e6])
    assert [fmt_num(v) for v in (0, 5, 1000, 1500, 2.5e6, 0.05, 0.123456, 156.7)] == \
        ["0", "5", "1k", "1.5k", "2.5M", "0.05", "0.123", "157"]
    assert "e+" not in "".join(fmt_num(t) for t in LogScale(0.01, 1e5).ticks())


def test_chart_escapes_every_text_and_draws_each_point() -> None:
    chart = Chart(HOSTILE, f"x {HOSTILE}", "y (t/s)", uid="c1",
                  series=[Series(HOSTILE, [(1, 2), (2, 4), (3, 3)], "#000", errors=[0.5, 0, 1],
                                 tips=[HOSTILE] * 3, labels=[HOSTILE, "", "b"])],
                  lines=[RefLine(HOSTILE, [(1, 1), (3, 1)], label=HOSTILE)])
    svg = chart.render()
    assert "<script" not in svg and HOSTILE not in svg
    assert esc(HOSTILE) in svg
    assert svg.count("<circle") == 3 == chart.n_points
    assert svg.count('class="line"') == 1 and svg.count('class="err"') == 2
    assert svg.startswith("<svg") and svg.endswith("</svg>")


def test_log_chart_skips_values_it_cannot_place() -> None:
    chart = Chart("t", "x", "y", x_log=True, y_log=True, uid="c2",
                  series=[Series("s", [(0, 1), (1, 0), (10, 100), (float("nan"), 5)], "#000")])
    svg = chart.render()
    assert svg.count("<circle") == 1  # only (10, 100) is placeable on log-log axes
    assert "nan" not in svg.lower()


def test_area_is_a_closed_filled_path() -> None:
    chart = Chart("t", "x", "y", uid="c3",
                  areas=[Area(HOSTILE, [0, 1, 2], [1, 2, 1], [3, 4, 3], "#0072B2")])
    svg = chart.render()
    assert re.search(r'<path class="area" d="M[^"]+ Z" fill="#0072B2">', svg)
    assert HOSTILE not in svg


def test_esc_covers_attributes() -> None:
    assert esc('a"b\'c<d>&') == "a&quot;b&#x27;c&lt;d&gt;&amp;"


# ---------------------------------------------------------------------------- fixtures


def _profile() -> HostProfile:
    return HostProfile(hostname=f"box {HOSTILE}",
                       cpu=CpuInfo(arch="x86_64", model="Test CPU", logical_threads=4,
                                   isa=["avx2"]),
                       gpus=[], software=SoftwareStack(python="3.11", os="Linux", strata="0"),
                       verdicts=[SupportVerdict("cpu", "supported", works=["fp32"])])


def _roofline() -> dict:
    dev = DeviceRoofline("cpu", "Test CPU", bandwidth={"triad": Figure(20.0, "STREAM")},
                         compute={"fp32": Figure(40.0, "matmul"), "bf16": Figure(80.0, "mm")},
                         peak_compute={"fp32": Peak(100.0, "datasheet")})
    return Roofline([dev], seconds=1.0).to_dict()


def _result(model: str, backend: str, n_prompt: int, n_gen: int, depth: int, tps: float,
            **info: object) -> StoredResult:
    metric = "prefill_tps" if n_prompt and not n_gen else "decode_tps"
    test = (f"pp{n_prompt}" if n_prompt else f"tg{n_gen}") + (f" @ d{depth}" if depth else "")
    ex = {"flops_per_prompt_token": 2e6, "bytes_per_token": 1e6, "decode_eta": 0.5,
          "prefill_eta": 0.3, "bound": "memory", "device": "cpu",
          "decode_ceiling_tps": 20000.0, "prefill_ceiling_tps": 20000.0}
    return StoredResult(model=model, backend=backend, test=test, n_prompt=n_prompt, n_gen=n_gen,
                        n_depth=depth, load_config={}, explain=ex, telemetry=None,
                        metrics={metric: {"mean": tps, "sd": tps * 0.05, "n": 3,
                                          "samples": [tps] * 3}},
                        info=dict(info))


def _db(tmp_path: Path, *, quality: bool = False, results: bool = True) -> sqlite3.Connection:
    conn = open_db(tmp_path / "s.db")
    fp = save_host(conn, _profile())
    save_measurement(conn, fp, "roofline", _roofline())
    if not results:
        return conn
    run = start_run(conn, fp, "bench", [], {})
    rows = [_result(HOSTILE, "llamacpp", p, 0, d, 1000.0 + p - d) for p in (64, 256)
            for d in (0, 512)]
    rows += [_result(HOSTILE, "llamacpp", 0, 32, d, 50.0 - d / 100) for d in (0, 512)]
    rows += [_result("synthetic:tiny@q4_0", "torch", 0, 32, 0, 20.0)]
    sustained = _result("synthetic:tiny@q4_0", "llamacpp", 0, 32, 0, 45.0, sustained={
        "seconds": 8, "window_s": 2, "timeline": [[i + 0.5, 50.0 - i] for i in range(8)],
        "first_tps": 49.5, "last_tps": 43.5, "drop": 0.12, "throttled": True,
        "evidence": ["cpu clock fell 30% while busy"]})
    sustained.test = "sustained tg32 8s"
    rows.append(sustained)
    for r in rows:
        add_result(conn, run, r)
    finish_run(conn, run, "complete")
    if quality:
        for model, ppl, kl, speed in (("synthetic:tiny@f16", 10.0, 0.0, 1.0),
                                      ("synthetic:tiny@q4_0", 10.4, 0.03, 2.4),
                                      (HOSTILE, 10.1, 0.01, 1.6)):
            save_measurement(conn, fp, "quality", {
                "model": model, "ref": "synthetic:tiny@f16", "backend": "llamacpp", "ppl": ppl,
                "kl": kl, "top1": 0.97, "speed_ratio": speed})
    return conn


# ---------------------------------------------------------------------------- derivations


def test_tokens_per_weight_pass_follows_the_backend_batching() -> None:
    assert tokens_per_weight_pass(_result("m", "torch", 512, 0, 0, 1.0)) == 512
    assert tokens_per_weight_pass(_result("m", "llamacpp", 512, 0, 0, 1.0, n_ubatch=256)) == 256
    assert tokens_per_weight_pass(_result("m", "torch", 0, 128, 0, 1.0)) == 1
    pg = _result("m", "torch", 64, 8, 0, 1.0)
    assert tokens_per_weight_pass(pg) == pytest.approx(72 / 9)  # one prefill + 8 decode passes


def test_roof_point_formula() -> None:
    p = roof_point(_result("m", "torch", 256, 0, 0, 1000.0))
    assert p is not None
    assert p.intensity == pytest.approx(2e6 * 256 / 1e6)  # FLOPs/token x tokens/pass / bytes
    assert p.gflops == pytest.approx(1000.0 * 2e6 / 1e9)  # t/s x FLOPs/token
    endpoint = _result("m", "openai", 0, 32, 0, 10.0)
    endpoint.explain = None
    assert roof_point(endpoint) is None


def test_sweeps_group_by_backend_and_fixed_size() -> None:
    rs = [_result("m", "torch", p, 0, d, 100.0) for p in (64, 256) for d in (0, 512)]
    by_depth = depth_sweeps(rs, "pp")
    assert {s.fixed for s in by_depth} == {"pp64", "pp256"} and varied(by_depth)
    by_prompt = prompt_sweeps(rs)
    assert {s.fixed for s in by_prompt} == {"d0", "d512"}
    assert [p.x for p in by_prompt[0].points] == [64, 256]
    assert not varied(depth_sweeps(rs[:1], "pp"))


def test_long_timelines_are_binned_short_ones_kept() -> None:
    short = [(i * 0.1, 100.0 + i) for i in range(20)]
    assert [(b.t, b.mean, b.n) for b in bin_timeline(short)] == [(t, v, 1) for t, v in short]
    long = [(i * 0.01, float(i % 7)) for i in range(1000)]
    bins = bin_timeline(long, max_points=50)
    assert len(bins) == 50 and sum(b.n for b in bins) == 1000
    assert all(b.lo <= b.mean <= b.hi for b in bins)
    assert bins[0].t < bins[-1].t <= long[-1][0]


def test_telemetry_samples_become_series_and_throttle_marks() -> None:
    tele = {"samples": [{"t_ns": 0, "readings": {"gpu0.sm_mhz": 2000, "gpu0.temp_c": 60,
                                                  "gpu0.clocks_event_reasons": 0x4}},
                        {"t_ns": 10**9, "readings": {"gpu0.sm_mhz": 1500, "gpu0.temp_c": 90,
                                                      "gpu0.clocks_event_reasons": 0x40}}]}
    series = telemetry_series(tele)
    assert series["MHz"]["gpu0.sm_mhz"] == [(0.0, 2000.0), (1.0, 1500.0)]
    assert "°C" in series
    assert throttled_times(tele) == [1.0]  # 0x4 (power cap) is normal, 0x40 is thermal
    assert telemetry_series(None) == {} and throttled_times({}) == []


# ---------------------------------------------------------------------------- report content


def _section_html(html: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}"[^>]*>(.*?)</section>', html, re.S)
    assert m, f"section {sid} missing"
    return m.group(1)


def test_report_escapes_user_text_and_fills_sections(tmp_path: Path) -> None:
    rep = build_report(_db(tmp_path, quality=True), planner=None)
    html = rep.html
    assert "<script" not in html.lower() and HOSTILE not in html
    assert esc(HOSTILE) in html
    assert f'http-equiv="Content-Security-Policy" content="{esc(CSP)}"' in html
    assert not re.search(r'(src|href)\s*=\s*"(https?:)?//', html)  # nothing fetched
    for sid in ("host", "roofline", "sweeps", "sustained", "frontier", "results"):
        assert rep.section(sid).has_data, sid
    assert _section_html(html, "roofline").count("<circle") == 8  # 7 results + sustained tg
    assert _section_html(html, "sweeps").count('class="chart"') == 3  # pp/tg depth, prompt
    sustained = _section_html(html, "sustained")
    assert "throttling seen" in sustained and "#c0392b" in sustained
    frontier = _section_html(html, "frontier")
    assert frontier.count("<circle") == 6  # 3 rows x (PPL chart + KL chart)
    assert "+0.400 PPL" in frontier and "2.40" in frontier


def test_frontier_uses_the_runs_delta_and_anchors_the_reference() -> None:
    rows = [{"model": "m@q4_0", "ref": "m@f16", "backend": "torch", "ppl": 12.0, "ref_ppl": 11.0,
             "delta_ppl": 0.9, "kl": 0.05, "top1": 0.9, "speed_ratio": 2.0,
             "model_label": "q4_0", "ref_label": "f16"}]
    fd = frontier_data(rows, [])
    ref, q4 = fd.points
    assert (ref.is_ref, ref.label, ref.speed, ref.ppl, ref.kl) == (True, "f16 (ref)", 1.0, 11.0, 0)
    assert (q4.d_ppl, q4.label) == (0.9, "q4_0")  # the run's own delta (same positions)
    assert summary_line(q4, fd.ratio) == ("m@q4_0 vs m@f16 (torch): 2.00\u00d7 decode, "
                                          "+0.900 PPL, KL 0.05, top-1 90.0%")
    no_speed = frontier_data([{**rows[0], "speed_ratio": None}], [])
    assert not no_speed.ratio and "decode t/s" in no_speed.speed_label
    # a ratio from a busy host (or too few repetitions) keeps its mark in the report
    busy = frontier_data([{**rows[0], "speed": {"caveat": "a busy host"}}], [])
    weak = busy.points[1]
    assert weak.caveat == "a busy host"
    assert summary_line(weak, busy.ratio).startswith(
        "m@q4_0 vs m@f16 (torch): 2.00\u00d7 decode (weak: a busy host)")
    assert "weak: a busy host" in str(_frontier_table(busy))
    assert "weak" not in str(_frontier_table(fd))


def test_empty_sections_name_the_command_that_fills_them(tmp_path: Path) -> None:
    rep = build_report(_db(tmp_path, results=False), planner=None)
    for sid, command in (("sweeps", "strata bench MODEL -d 0,512,2048"),
                         ("sustained", "strata bench MODEL --sustained"),
                         ("frontier", "strata quality MODEL"), ("fit", "strata fit MODEL"),
                         ("results", "strata bench MODEL")):
        body = _section_html(rep.html, sid)
        assert not rep.section(sid).has_data
        assert 'class="empty"' in body and command in body, sid
    assert "no quality results yet" in _section_html(rep.html, "frontier")
    assert rep.section("host").has_data  # a probe + roofline is worth a page


FIT_PLAN = {
    "options": {"ctx": 4096, "backend": "llamacpp"},
    "devices": [{"device": "cpu", "name": "Test CPU", "verdict": "fits",
                 "verdict_text": "fits (-ngl 0, CPU only)", "available": 8 * 2**30,
                 "placement": {"device": {"total": 2**30}}, "max_ctx": 32768,
                 "quants_that_fit": ["f16", "q4_0"]}],
    "predictions": [{"device": "cpu", "test": "tg128", "phase": "decode", "tps": 41.5,
                     "low_tps": 30.0, "high_tps": 48.0,
                     "eta": {"value": 0.7, "basis": "prior η 0.7"}}],
    "prediction_absent": ["gpu: none here"],
}


def test_fit_table_uses_the_planner_and_survives_its_failures(tmp_path: Path) -> None:
    conn = _db(tmp_path)
    asked = []

    def planner(model: str, backend: str) -> dict:
        asked.append((model, backend))
        if model == HOSTILE:
            raise ValueError("no metadata\nsecond line")
        return FIT_PLAN

    rep = build_report(conn, planner=planner)
    fit = _section_html(rep.html, "fit")
    assert rep.section("fit").has_data
    assert {("synthetic:tiny@q4_0", "torch"), ("synthetic:tiny@q4_0", "llamacpp")} <= set(asked)
    assert "fits (-ngl 0, CPU only)" in fit and "1.00 GiB" in fit and "32,768" in fit
    assert "tg128: 41.5 (30.0-48.0)" in fit and "prior η 0.7" in fit and "f16, q4_0" in fit
    assert "no prediction: gpu: none here" in fit and "prediction" in fit
    assert "fit failed (no metadata)" in fit and "second line" not in fit


def test_fit_is_optional(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = _db(tmp_path)
    data = build_report(conn, planner=None).data
    monkeypatch.setitem(sys.modules, "strata.fit", None)  # as if fit were not installed
    assert default_planner(conn, data) is None
    fit = _section_html(build_report(conn).html, "fit")
    assert "fit predictions are not in this report" in fit and "strata fit synthetic:" in fit


def test_real_fit_plans_a_synthetic_preset(tmp_path: Path) -> None:
    rep = build_report(_db(tmp_path))
    fit = _section_html(rep.html, "fit")
    assert rep.section("fit").has_data, fit
    assert "synthetic:tiny@q4_0" in fit and "cpu (Test CPU)" in fit
    assert f"{esc(HOSTILE)}: fit failed" in fit  # an unknown model is a note, not a crash


# ---------------------------------------------------------------------------- bad input


def test_empty_db_is_an_input_error(tmp_path: Path) -> None:
    from strata.commands.report import run_report

    with pytest.raises(InputError) as exc:
        run_report(open_db(tmp_path / "empty.db"), tmp_path / "r.html")
    assert str(exc.value) == EMPTY_DB and exc.value.exit_code == 2
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("where", ["under_a_file", "a_folder", "a_missing_folder"])
def test_unwritable_out_is_an_input_error(tmp_path: Path, where: str) -> None:
    from strata.commands.report import run_report

    (tmp_path / "file").write_text("x")
    out = {"under_a_file": tmp_path / "file" / "r.html", "a_folder": tmp_path,
           "a_missing_folder": tmp_path / "nope" / "r.html"}[where]
    with pytest.raises(InputError) as exc:
        run_report(_db(tmp_path), out)
    assert str(exc.value).startswith(f"--out {out}:") and "\n" not in str(exc.value)
    assert exc.value.exit_code == 2
    assert not list(tmp_path.glob(".report-*"))  # no temp file left behind
    assert not (tmp_path / "nope").exists()  # no folder created silently


def test_cli_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    proc = run_cli("report", "--out", str(tmp_path / "r.html"), home=tmp_path / "home")
    assert proc.returncode == 2, proc.stderr
    assert "no results yet" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------- real browser

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def _browse(page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"  # a new empty one each time
    profile.mkdir()
    cmd = [_chromium() or "chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra,
           page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _console(stderr: str) -> list[str]:
    """Every message the page wrote to the console (chromium logs them as ':CONSOLE')."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def _png_rows(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the (filtered) scanlines of an 8-bit RGB/RGBA PNG, stdlib only."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, bpp = 8, b"", 0, 0, 4
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * bpp + 1
    assert len(raw) == height * stride
    return width, height, [raw[i * stride + 1:(i + 1) * stride] for i in range(height)]


def _busy_rows(rows: list[bytes]) -> float:
    """Share of scanlines with varied bytes. A flat row filters to one or two byte values
    whatever PNG filter the encoder picked; text and plots give many."""
    return sum(len(set(r)) > 8 for r in rows) / max(len(rows), 1)


@pytest.fixture(scope="module")
def chromium() -> str:
    path = _chromium()
    if path is None:
        pytest.skip("chromium not installed: run scripts/install_test_deps.sh "
                    "(apt-get install -y chromium)")
    return path


def _real_quality(home: Path) -> None:
    """q4_0 vs q8_0 with strata quality's own code (in-process: not in cli.py yet), so the
    frontier is drawn from what that command really stores."""
    from rich.console import Console

    from strata.commands.quality import quality_main

    quiet = Console(file=open(os.devnull, "w"))  # noqa: SIM115 (closed with the process)
    quality_main(model="synthetic:tiny@q4_0", ref="synthetic:tiny@q8_0", text=None, ctx=64,
                 backend="llamacpp", max_chunks=2, json_out=False,
                 conn=open_db(home / "strata.db"), out=quiet, err=quiet)


@pytest.fixture(scope="module")
def real_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A report of real measurements: a sweep on two backends, a sustained run, and a quality
    comparison of two quantisations."""
    home = tmp_path_factory.mktemp("report-home")
    for args in (["synthetic:tiny@q8_0", "-B", "llamacpp,torch", "-p", "8,16", "-n", "4",
                  "-d", "0,8", "-r", "2"],
                 ["synthetic:tiny@q4_0", "-B", "llamacpp", "-p", "none", "-n", "4", "-r", "2"],
                 ["synthetic:tiny@q8_0", "-B", "llamacpp", "-n", "16", "-p", "none",
                  "--sustained", "4"]):
        proc = run_cli("bench", *args, home=home, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    _real_quality(home)
    from strata.commands.report import run_report

    out = home / "report.html"
    run_report(open_db(home / "strata.db"), out)
    return home, out


@pytest.mark.slow
def test_report_in_a_real_browser(chromium: str, real_report: tuple[Path, Path],
                                  tmp_path: Path) -> None:
    home, page = real_report
    n_results = len(query_results(open_db(home / "strata.db")))
    # Control: the console capture must see a broken page, or "no messages" proves nothing.
    broken = tmp_path / "broken.html"
    broken.write_text("<!doctype html><title>t</title><script>undefinedFn()</script>")
    assert _console(_browse(broken, tmp_path, "--dump-dom").stderr)

    proc = _browse(page, tmp_path, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _console(proc.stderr) == []
    dom = proc.stdout
    for sid in ("host", "roofline", "sweeps", "sustained", "frontier", "fit", "results"):
        assert f'<section id="{sid}"' in dom, sid
    charts = re.findall(r'<figure class="chart" id="([^"]+)" data-points="(\d+)">(.*?)</figure>',
                        dom, re.S)
    ids = {cid for cid, _, _ in charts}
    assert {"chart-roofline", "chart-depth-pp", "chart-depth-tg", "chart-prompt",
            "chart-sustained-0"} <= ids, ids
    for cid, n, body in charts:
        assert int(n) > 0 and body.count("<circle") >= int(n), cid
        if not cid.startswith("chart-frontier"):  # frontier charts are scatter plots
            assert body.count("<path") >= 1, cid  # lines, roofs or whiskers
    roof = next(body for cid, _, body in charts if cid == "chart-roofline")
    assert roof.count("<circle") == n_results == 14  # every stored result is a point
    # the reference anchor and q4_0, on the PPL and the KL chart
    assert "chart-frontier-ppl" in ids and "chart-frontier-kl" in ids
    assert "strata fit" in dom
    assert re.search(r'<section id="fit"[^>]*>.*?<table', dom, re.S)  # fit planned the model

    shot = tmp_path / "report.png"
    proc = _browse(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,4000")
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    assert _console(proc.stderr) == []
    width, height, rows = _png_rows(shot)
    assert (width, height) == (1280, 4000)
    assert _busy_rows(rows) > 0.25, "screenshot looks blank"

    blank = tmp_path / "blank.html"
    blank.write_text("<!doctype html><title>b</title>")
    blank_shot = tmp_path / "blank.png"
    _browse(blank, tmp_path, f"--screenshot={blank_shot}", "--window-size=1280,4000")
    assert _busy_rows(_png_rows(blank_shot)[2]) < 0.01  # the blank check can fail


@pytest.mark.slow
def test_hostile_names_and_quality_render_in_the_browser(chromium: str,
                                                         tmp_path: Path) -> None:
    """Hand-made data covering what real runs here cannot yet: the frontier, a throttled run,
    user text full of markup. Nothing may execute or be logged."""
    page = tmp_path / "hostile.html"
    page.write_text(build_report(_db(tmp_path, quality=True), planner=None).html)
    proc = _browse(page, tmp_path, "--dump-dom")
    assert proc.returncode == 0 and _console(proc.stderr) == [], proc.stderr[-2000:]
    assert "<script>alert" not in proc.stdout
    assert proc.stdout.count('id="chart-frontier-') == 2


# Injected into a copy of the page (the report itself has no scripts): every box whose
# content is wider than it and that does not scroll is clipping something; the page itself
# must not scroll sideways. The verdict lands in the DOM that --dump-dom prints.
CLIP_PROBE = """<script>
addEventListener('load', () => {
  const clipped = [];
  const right = document.documentElement.clientWidth;
  for (const el of document.querySelectorAll('body *')) {
    const box = el.getBoundingClientRect();
    if (box.width < 2) continue;  // not laid out (a closed <details>)
    const ox = getComputedStyle(el).overflowX;
    const name = el.localName + (el.id ? '#' + el.id : '');
    if (['hidden', 'clip'].includes(ox) && el.scrollWidth > el.clientWidth + 1) {
      clipped.push(`${name} hides ${el.scrollWidth - el.clientWidth}px`);
    }
    const scroller = el.closest('.tbl');
    if (el.localName === 'table' && !scroller && box.right > right + 1) {
      clipped.push(`${name} runs ${Math.round(box.right - right)}px off the page`);
    }
  }
  const page = document.documentElement.scrollWidth - innerWidth;
  document.body.setAttribute('data-clip', JSON.stringify({clipped: clipped.slice(0, 20), page}));
});
</script>"""


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 1920])
def test_no_table_is_clipped_at_common_window_widths(chromium: str,
                                                     real_report: tuple[Path, Path],
                                                     tmp_path: Path, width: int) -> None:
    """The report at 1280 and 1920 px in headless Chromium: nothing is cut off sideways (a
    wide table scrolls inside its own box), and the page never scrolls sideways. The
    screenshots stay in the test's tmp folder as artefacts."""
    import html as html_lib

    _, page = real_report
    probed = tmp_path / "probed.html"
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    probed.write_text(text.replace("</body>", CLIP_PROBE + "</body>"))  # the page forbids
    # scripts (its CSP); this copy drops that line only so the measuring script may run
    proc = _browse(probed, tmp_path, "--dump-dom", f"--window-size={width},2000",
                   "--virtual-time-budget=3000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'data-clip="([^"]*)"', proc.stdout)
    assert found, "the probe did not run"
    verdict = json.loads(html_lib.unescape(found.group(1)))
    assert verdict["clipped"] == [] and verdict["page"] <= 0, verdict
    # control: the probe sees a table that runs off the page (the check can fail)
    wide = tmp_path / "wide.html"
    wide.write_text(f"<!doctype html><body><table><tr><td>{'x' * (width // 4)}</td></tr>"
                    f"</table>{CLIP_PROBE}</body>")  # one unbreakable word, ~2x the window
    control = re.search(r'data-clip="([^"]*)"', _browse(
        wide, tmp_path, "--dump-dom", f"--window-size={width},2000").stdout)
    assert control and "off the page" in html_lib.unescape(control.group(1))
    shot = tmp_path / f"report-{width}.png"
    _browse(page, tmp_path, f"--screenshot={shot}", f"--window-size={width},2000")
    assert shot.exists() and _png_rows(shot)[0] == width
