"""`strata fit`: memory per device from metadata alone, verdicts and -ngl, largest context,
fitting quantisations, and predictions checked against real llama.cpp and real bench runs.

GPU verdicts use recorded-style probes of machines that are not here (tests/fixtures/fit/);
the memory rules are checked against what llama.cpp really allocates on this machine
(`python -m strata.fit.calibrate`), the predictions against a real `strata bench`.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.bench.explain import KV_BYTES
from strata.errors import InputError
from strata.fit import FITS, NO, PARTIAL, EtaHistory, FitOptions, FitReport, fit_model
from strata.fit.memory import (
    LLAMACPP_CPU,
    MiB,
    Shape,
    llamacpp_reserved,
    memory,
    whole,
)
from strata.fit.verdict import Case, fits_whole, on_gpu
from strata.fit.weights import requantised
from strata.hardware.profile import HostProfile
from strata.measure.roofline import Roofline
from strata.models.presets import get_preset
from strata.models.source import resolve
from strata.models.synthetic import SyntheticModel
from strata.store.hosts import latest_measurement, load_host
from strata.store.runs import StoredResult
from tests.conftest import FIXTURES, home_db, run_cli

FIT = FIXTURES / "fit"
GiB = 2**30

def run_fit(*args: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli("fit", *args, home=home, timeout=timeout)


def fit_json(*args: str, home: Path) -> dict:
    proc = run_fit(*args, "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def host(name: str) -> HostProfile:
    return HostProfile.from_dict(json.loads((FIT / f"{name}.json").read_text()))


def plan(ref: str, host_name: str, **options: object) -> FitReport:
    return fit_model(resolve(ref), host(host_name), FitOptions(**options))


# -- memory from metadata ---------------------------------------------------------------------


def test_kv_cache_is_grouped_query_aware_and_scales_with_ctx_and_batch(strata_home: Path) -> None:
    report = plan("synthetic:llama-3.1-8b@q4_0", "rtx4090_24gb", ctx=8192, batch=2)
    cpu = report.row("cpu").placement.device
    # 2 (K, V) x 32 layers x 8 kv heads x 128 head_dim x 8192 ctx x 2 B (f16) x 2 sequences
    assert cpu.kv == 2 * 32 * 8 * 128 * 8192 * 2 * 2 == 2 * GiB
    # a hidden-size calculator would say 32 heads' worth: 4x too much for this GQA model
    assert cpu.kv * 4 == 2 * 32 * 4096 * 8192 * 2 * 2
    q8 = plan("synthetic:llama-3.1-8b@q4_0", "rtx4090_24gb", ctx=8192, batch=2, kv_type="q8_0")
    assert q8.row("cpu").placement.device.kv == int(cpu.kv * KV_BYTES["q8_0"] / 2)


def test_weights_of_a_real_gguf_are_its_exact_tensor_bytes(strata_home: Path) -> None:
    import gguf

    path = resolve("synthetic:tiny@q4_0").path("gguf", "llamacpp")  # a real file on disk
    reader = gguf.GGUFReader(path)  # an independent reader: the gguf package's own
    file_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    report = plan(str(path), "rtx4090_24gb", ctx=512)
    assert report.model["kind"] == "gguf"
    assert report.row("cpu").placement.device.weights == file_bytes
    own = next(q for q in report.quants if q.quant == "q4_0")
    assert own.exact and own.weight_bytes == file_bytes
    # another mix of the file: exact by llama.cpp's rules; F16 by hand: every matrix at 2
    # bytes a value, norms kept at F32
    f16 = next(q for q in report.quants if q.quant == "f16")
    by_hand = sum(2 * int(t.n_elements) if len(t.shape) == 2 else 4 * int(t.n_elements)
                  for t in reader.tensors)
    assert f16.exact and f16.weight_bytes == by_hand


def test_synthetic_presets_are_planned_without_writing_anything(strata_home: Path) -> None:
    for ref in ("synthetic:llama-3.1-8b@q4_0", "synthetic:qwen2.5-1.5b@f32"):
        report = plan(ref, "h100_80gb", ctx=4096)
        assert report.rows and all(q.exact for q in report.quants)
    proc = run_fit("synthetic:llama-3.1-8b@f16", "--ctx", "8192", home=strata_home)
    assert proc.returncode == 0, proc.stderr
    for column in ("device", "weights", "KV", "buffers", "total", "available", "verdict",
                   "-ngl", "max ctx"):
        assert column in proc.stdout, column
    assert "fits (-ngl 0, CPU only)" in proc.stdout and "rule: llama.cpp CPU" in proc.stdout
    cache = strata_home / "cache"
    assert not cache.exists() or not any(cache.rglob("*")), list(cache.rglob("*"))


def test_quantisation_estimate_from_parameter_count_matches_a_presets_exact_bytes() -> None:
    preset = get_preset("llama-3.2-1b")
    f16 = SyntheticModel(preset, "f16").gguf_spec()
    for quant in ("f32", "q8_0", "q4_0"):
        exact = SyntheticModel(preset, quant).gguf_spec().weight_bytes()
        assert requantised(f16, quant).weight_bytes() == exact, quant


# -- a 70B Hugging Face model, headers only ---------------------------------------------------

LLAMA_70B = {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
             "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
             "vocab_size": 128256, "max_position_embeddings": 131072,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _hf_tensors(cfg: dict) -> list[tuple[str, list[int]]]:
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    out = [("model.embed_tokens.weight", [v, h])]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", [h]), (p + "self_attn.q_proj.weight", [h, h]),
                (p + "self_attn.k_proj.weight", [kv, h]), (p + "self_attn.v_proj.weight", [kv, h]),
                (p + "self_attn.o_proj.weight", [h, h]),
                (p + "post_attention_layernorm.weight", [h]),
                (p + "mlp.gate_proj.weight", [f, h]), (p + "mlp.up_proj.weight", [f, h]),
                (p + "mlp.down_proj.weight", [h, f])]
    return [*out, ("model.norm.weight", [h]), ("lm_head.weight", [v, h])]


def write_sparse_hf(folder: Path, cfg: dict) -> int:
    """A real HF directory whose safetensors data is a hole: headers exact, 0 bytes on disk.
    Returns the data bytes the header describes."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    header, offset = {}, 0
    for name, shape in _hf_tensors(cfg):
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)  # sparse: the weights are never written or read
    return offset


@pytest.fixture
def llama70b(tmp_path: Path) -> tuple[Path, int]:
    folder = tmp_path / "llama-3.1-70b-shaped"
    return folder, write_sparse_hf(folder, LLAMA_70B)


def test_a_70b_from_headers_partially_offloads_on_an_h100(llama70b: tuple[Path, int]) -> None:
    folder, data_bytes = llama70b
    report = plan(str(folder), "h100_80gb", ctx=8192)
    assert report.model["weight_bytes"] == data_bytes  # 141 GB of bf16, from the header alone
    gpu = report.row("cuda:0")
    assert gpu.verdict == PARTIAL and 0 < gpu.placement.blocks < 80
    assert gpu.placement.ngl == gpu.placement.blocks + 1  # -ngl counts the output layer
    assert report.row("cpu").verdict == FITS  # 256 GiB of RAM holds it whole
    # q4_0 by llama.cpp's rules, by hand: the head (lm_head, 8192 columns: whole 256-blocks)
    # at Q6_K (210 B per 256), every other matrix at Q4_0 (18 B per 32), norms at f32
    head = LLAMA_70B["vocab_size"] * LLAMA_70B["hidden_size"]
    params_2d = sum(s[0] * s[1] for _n, s in _hf_tensors(LLAMA_70B) if len(s) == 2) - head
    params_1d = sum(s[0] for _n, s in _hf_tensors(LLAMA_70B) if len(s) == 1)
    q4 = next(q for q in report.quants if q.quant == "q4_0")
    assert q4.exact and q4.weight_bytes == params_2d * 18 // 32 + head * 210 // 256 + \
        params_1d * 4
    assert "q4_0" in gpu.quants and "f16" not in gpu.quants and "q8_0" in gpu.quants


def test_a_70b_does_not_fit_a_4090_desktop(llama70b: tuple[Path, int]) -> None:
    report = plan(str(llama70b[0]), "rtx4090_24gb", ctx=8192)
    gpu = report.row("cuda:0")
    # 24 GB of GPU + 48 GiB of RAM < 141 GB: the layers left on the CPU do not fit in RAM
    assert gpu.verdict == NO and "RAM" in gpu.reason
    assert report.row("cpu").verdict == NO
    # ~40 GB fits the 48 GiB of RAM whole, and the smaller mixes
    assert report.row("cpu").quants == ["q4_k_m", "q4_0", "q3_k_m", "q2_k"]


def test_hf_config_missing_fields_is_an_input_error(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    cfg = {**LLAMA_70B, "num_hidden_layers": 2}
    write_sparse_hf(folder, cfg)
    (folder / "config.json").write_text(json.dumps(
        {k: v for k, v in cfg.items() if k != "num_hidden_layers"}))
    proc = run_fit(str(folder), home=tmp_path / "home")
    assert proc.returncode == 2
    assert "num_hidden_layers" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# -- GPU verdicts and -ngl arithmetic on recorded hosts ---------------------------------------


def _gpu_case(ref: str, host_name: str, ctx: int) -> tuple[Case, FitReport]:
    report = plan(ref, host_name, ctx=ctx)
    model = resolve(ref)
    case = Case(model.spec_for("gguf"), Shape(ctx=ctx), FitOptions().rules)
    return case, report


def test_partial_offload_picks_the_largest_ngl_that_fits_the_gpu() -> None:
    case, report = _gpu_case("synthetic:llama-3.1-8b@f32", "rtx4090_24gb", 8192)
    gpu = report.row("cuda:0")
    assert gpu.verdict == PARTIAL
    ngl, vram = gpu.placement.ngl, gpu.budget.available
    assert on_gpu(case, ngl).device.total <= vram < on_gpu(case, ngl + 1).device.total
    # llama.cpp's rule, counted here from the tensor names: -ngl N offloads the output layer
    # and the last N - 1 blocks
    spec, first = case.spec, case.spec.n_layers + 1 - ngl
    expect = sum(t.nbytes for t in spec.tensors
                 if (t.name.startswith("blk.") and int(t.name.split(".")[1]) >= first)
                 or t.name in ("output.weight", "output_norm.weight"))
    assert gpu.placement.device.weights == expect
    assert gpu.placement.blocks == ngl - 1 and gpu.placement.output
    assert gpu.placement.host.weights == spec.weight_bytes() - expect  # the rest stays in RAM
    assert f"-ngl {ngl}" in gpu.verdict_text and f"{ngl - 1} of 32 layers" in gpu.verdict_text


def test_full_offload_on_h100_and_the_largest_context_on_a_4090() -> None:
    case, report = _gpu_case("synthetic:llama-3.1-8b@f32", "h100_80gb", 8192)
    h100 = report.row("cuda:0")
    assert h100.verdict == FITS and h100.placement.ngl == 33 and h100.placement.blocks == 32
    case, report = _gpu_case("synthetic:llama-3.1-8b@q4_0", "rtx4090_24gb", 8192)
    gpu = report.row("cuda:0")
    assert gpu.verdict == FITS and gpu.placement.ngl == 33
    top = gpu.max_ctx
    assert top is not None and 8192 < top < 131072 and not gpu.max_ctx_is_model_limit
    ram = report.row("cpu").budget
    assert fits_whole(case.with_ctx(top), gpu.budget, ram)
    assert not fits_whole(case.with_ctx(top + 256), gpu.budget, ram)
    # the tied embedding of a small model is copied to the GPU with the output layer
    small = plan("synthetic:qwen2.5-0.5b@q8_0", "rtx4090_24gb", ctx=4096).row("cuda:0")
    spec = resolve("synthetic:qwen2.5-0.5b@q8_0").spec
    embd = spec.tensor("token_embd.weight").nbytes
    # blocks + final norm + a copy of the tied embedding as the head: the file's bytes
    assert small.placement.device.weights == spec.weight_bytes()
    assert small.placement.host.weights == embd  # the input lookup stays on the CPU


def test_quantisations_that_fit_each_device() -> None:
    report = plan("synthetic:llama-3.1-8b@q4_0", "rtx4090_24gb", ctx=8192)
    mixes = ["q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "q3_k_m", "q2_k", "f16"]
    assert report.row("cuda:0").quants == mixes  # f16's 16 GB too
    assert report.row("cpu").quants == mixes  # 48 GiB of RAM
    long = plan("synthetic:llama-3.1-8b@q4_0", "rtx4090_24gb", ctx=131072)
    # 16 GiB of KV + 8 GiB of f32 attention scores (no flash attention) at 128k: nothing whole
    assert long.row("cuda:0").quants == [] and long.row("cuda:0").verdict == PARTIAL
    assert long.row("cpu").quants == mixes
    weights = {q.quant: q.weight_bytes for q in report.quants}
    preset = get_preset("llama-3.1-8b")
    for quant, nbytes in weights.items():
        assert nbytes == SyntheticModel(preset, quant).gguf_spec().weight_bytes()


def test_torch_holds_weights_in_its_runtime_dtype() -> None:
    report = plan("synthetic:llama-3.2-1b@q4_0", "rtx4090_24gb", ctx=4096, backend="torch")
    # torch runs the Hugging Face form: no rope_freqs tensor (Llama 3's factors are its
    # config's rope_scaling there)
    params = resolve("synthetic:llama-3.2-1b@q4_0").spec_for("hf").params()
    # the 7950X has native bf16 (the torch backend's rule): 2 B/weight on CPU; f16 on the GPU
    assert report.row("cpu").placement.device.weights == params * 2
    gpu = report.row("cuda:0")
    assert gpu.placement.ngl is None and gpu.placement.device.weights == params * 2
    assert gpu.verdict == FITS and report.model["kv_type"] == "bfloat16"


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "names"), [
    (("synthetic:tiny", "--ctx", "0"), "--ctx"),
    (("synthetic:tiny", "--ctx", "10000001"), "--ctx"),
    (("synthetic:tiny", "-np", "0"), "-np"),
    (("synthetic:tiny", "--batch", "4"), "-np/--parallel"),
    (("synthetic:tiny", "--kv-type", "q5_1"), "--kv-type"),
    (("synthetic:tiny", "--kv-type", "q8_0"), "head_dim 16"),
    (("synthetic:tiny", "--backend", "vllm"), "--backend"),
    (("synthetic:tiny", "--backend", "torch", "--kv-type", "q8_0"), "--kv-type"),
    (("synthetic:no-such-preset",), "unknown preset"),
    (("http://127.0.0.1:9",), "endpoint"),
])
def test_bad_input_is_one_line_exit_2(args: tuple[str, ...], names: str, tmp_path: Path) -> None:
    proc = run_fit(*args, home=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], proc.stderr


def test_unknown_model_format_is_exit_2(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("not a model")
    proc = run_fit(str(junk), home=tmp_path / "home")
    assert proc.returncode == 2 and "unknown model format" in proc.stderr


def test_help_renders_with_every_flag(tmp_path: Path) -> None:
    proc = run_fit("--help", home=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    for text in ("--ctx", "--parallel", "--kv-type", "--backend", "--json", "q4_0"):
        assert text in proc.stdout, text


def test_options_validate_in_the_api_too() -> None:
    with pytest.raises(InputError, match="--ctx"):
        FitOptions(ctx=-5)
    assert FitOptions(ctx=10_000_000).ctx == 10_000_000


# -- the rules against what llama.cpp really allocates ----------------------------------------

CALIBRATION = [("synthetic:tiny", 512, "f16", 0.15), ("synthetic:tiny", 2048, "f16", 0.15),
               ("synthetic:smollm2-135m", 512, "f16", 0.06),
               ("synthetic:smollm2-135m", 2048, "f16", 0.06),
               ("synthetic:smollm2-135m", 2048, "q8_0", 0.08)]


@pytest.fixture(scope="module")
def calib_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """GGUFs written once, before any measurement (writing them is not a load's cost)."""
    home = tmp_path_factory.mktemp("calib-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRATA_HOME", str(home))
        for ref in {r for r, *_ in CALIBRATION}:
            resolve(ref).path("gguf", "llamacpp")
    yield home


@pytest.mark.slow
@pytest.mark.parametrize(("ref", "ctx", "kv", "tolerance"), CALIBRATION)
def test_memory_rules_match_what_llamacpp_allocates(calib_home: Path, ref: str, ctx: int,
                                                    kv: str, tolerance: float) -> None:
    env = {**os.environ, "STRATA_HOME": str(calib_home)}
    proc = subprocess.run([sys.executable, "-m", "strata.fit.calibrate", ref, "--ctx", str(ctx),
                           "--kv-type", kv], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    real = json.loads(proc.stdout)
    spec, shape = resolve(ref).spec_for("gguf"), Shape(ctx=ctx, kv_type=kv)
    predicted = memory(spec, shape, whole(spec), LLAMACPP_CPU)
    reported = real["reported_bytes"]
    half_hundredth = 0.006 * MiB  # llama.cpp logs MiB with two decimals
    assert abs(reported["KV"] - predicted.kv) <= half_hundredth
    assert abs(reported["model"] - predicted.weights) <= 0.01 * predicted.weights + MiB
    reserved = llamacpp_reserved(spec, shape, whole(spec))
    compute_err = (reserved - reported["compute"]) / reported["compute"]
    rss = real["rss_delta_bytes"]
    rss_err = (predicted.total - rss) / rss
    print(f"\n{ref} ctx {ctx} KV {kv}: compute buffer rule {reserved / MiB:.2f} MiB vs llama.cpp "
          f"{reported['compute'] / MiB:.2f} MiB ({compute_err:+.1%}); predicted total "
          f"{predicted.total / MiB:.1f} MiB vs RSS growth {rss / MiB:.1f} MiB ({rss_err:+.1%})")
    assert abs(compute_err) <= 0.05
    assert abs(rss_err) <= tolerance


# -- predictions against real bench results ---------------------------------------------------

SMOLLM = "synthetic:smollm2-135m@q8_0"


@pytest.fixture(scope="module")
def bench_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh STRATA_HOME holding one real `strata bench` run (and the roofline it measured)."""
    home = tmp_path_factory.mktemp("fit-bench-home")
    env = {**os.environ, "STRATA_HOME": str(home), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "strata.cli", "bench", SMOLLM, "-B", "llamacpp",
                           "-p", "64", "-n", "16", "-r", "3", "-o", "json"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    (home / "bench.json").write_text(proc.stdout)
    return home


@pytest.mark.slow
def test_decode_prediction_uses_the_hosts_eta_and_is_close_to_bench(bench_home: Path) -> None:
    measured = next(r for r in json.loads((bench_home / "bench.json").read_text())
                    if r["test"] == "tg16")
    report = fit_json(SMOLLM, "--ctx", "2048", home=bench_home)
    tg = next(p for p in report["predictions"] if p["test"] == "tg128")
    if any("cache-resident" in why for why in tg["eta_left_out"]):
        # a CPU whose last-level cache holds the whole model (480 MiB L3 on some Xeons):
        # its η measures per-token overhead, not the DRAM roofline: left out, said so
        assert tg["eta_n"] == 0 and "1 cache-resident" in tg["eta_basis"]
        pytest.skip("this CPU's cache holds the model: its η cannot inform a prediction")
    if measured["host_busy"]:  # other processes used the CPUs meanwhile: left out, said so
        assert tg["eta_n"] == 0 and "1 on a busy host" in tg["eta_basis"]
        pytest.skip("the bench ran on a busy host: nothing to compare the prediction with")
    assert tg["eta_n"] == 1 and [s["test"] for s in tg["eta_sources"]] == ["tg16"]
    assert "1 past llamacpp decode result on cpu" in tg["eta_basis"]
    assert tg["eta"] == pytest.approx(measured["eta"])
    # the same ceiling bench explained its result with, up to the KV read at a deeper context
    assert tg["ceiling_ts"] == pytest.approx(measured["decode_ceiling_ts"], rel=0.02)
    error = (tg["predicted_ts"] - measured["avg_ts"]) / measured["avg_ts"]
    print(f"\n{SMOLLM}: predicted decode {tg['predicted_ts']:.1f} t/s vs measured "
          f"{measured['avg_ts']:.1f} t/s ({error:+.1%}); η {tg['eta']:.2f} from the DB")
    assert abs(error) <= 0.35
    pp = next(p for p in report["predictions"] if p["phase"] == "prefill")
    assert pp["predicted_ts"] > 0
    # the prefill result has its own busy-host monitor: left out (and said so) when other
    # processes used the CPUs during it, as the decode result would be
    assert pp["eta_n"] == 1 or any("busy host" in why for why in pp["eta_left_out"]), pp


@pytest.mark.slow
def test_prior_eta_where_the_host_has_no_past_results(bench_home: Path) -> None:
    conn = home_db(bench_home)
    fp = conn.execute("SELECT fingerprint FROM hosts").fetchone()[0]
    roofline = Roofline.from_dict(latest_measurement(conn, fp, "roofline"))
    host_profile = load_host(conn, fp)
    report = fit_model(resolve(SMOLLM), host_profile, FitOptions(ctx=2048), roofline,
                       EtaHistory("llamacpp"))
    assert report.predictions
    for p in report.predictions:
        assert p.eta.n == 0 and "prior" in p.eta.basis and "0.5-0.9" in p.eta.basis
        assert p.tps == pytest.approx(p.ceiling_tps * 0.7)
        assert (p.low_tps, p.high_tps) == pytest.approx((p.ceiling_tps * 0.5, p.ceiling_tps * 0.9))
    torch = fit_json(SMOLLM, "--backend", "torch", home=bench_home)  # no torch results stored
    assert all(p["eta_n"] == 0 for p in torch["predictions"])


@pytest.mark.slow
def test_cache_resident_results_set_no_eta(bench_home: Path) -> None:
    conn = home_db(bench_home)
    fp = conn.execute("SELECT fingerprint FROM hosts").fetchone()[0]
    history = EtaHistory.from_db(conn, fp, "llamacpp", cache_bytes=10**12)  # everything "fits"
    assert ("cpu", "decode") not in history.values and history.cache_resident["cpu"] == 1
    assert history.eta("cpu", "decode").n == 0  # falls back to the prior, said so
    # a cache-resident model's tiny matmuls say nothing about a big model's prefill either
    assert ("cpu", "prefill") not in history.values
    assert history.excluded[("cpu", "prefill")] == {"cache-resident": 1}
    assert "left out: 1 cache-resident" in history.eta("cpu", "prefill").basis


# Recorded results of one host (explain and telemetry as bench stores them): a toy model
# whose 1 MiB per token sat in the 32 MiB cache (prefill η 0.01), two 8B q4_0 runs on a
# quiet host (η 0.58 and 0.64), and one 8B run while a compile used 60% of the CPUs.
LLC = 32 << 20


def _recorded(rid: int, model: str, pp_eta: float, tg_eta: float, bytes_per_token: float,
              busy: bool | None) -> StoredResult:
    load = ({"busy": busy, "busy_share": 0.6 if busy else 0.02} if busy is not None else None)
    return StoredResult(model, "llamacpp", "pp512+tg128", 512, 128, 0, {}, {},
                        {"device": "cpu", "prefill_eta": pp_eta, "decode_eta": tg_eta,
                         "bytes_per_token": bytes_per_token},
                        {"host_load": load} if load else {}, {}, run_id=rid, id=rid)


RECORDED = [_recorded(1, "synthetic:tiny", 0.01, 2.5, 1 << 20, False),
            _recorded(2, "llama-8b-q4_0.gguf", 0.58, 0.71, 4.6e9, False),
            _recorded(3, "llama-8b-q4_0.gguf", 0.64, 0.75, 4.6e9, None),  # before the monitor
            _recorded(4, "llama-8b-q4_0.gguf", 0.001, 0.02, 4.6e9, True)]


def test_prefill_eta_leaves_out_cache_resident_and_busy_host_results() -> None:
    history = EtaHistory.from_results(RECORDED, "llamacpp", LLC)
    for phase, values in (("prefill", (0.58, 0.64)), ("decode", (0.71, 0.75))):
        eta = history.eta("cpu", phase)
        assert [s.result_id for s in eta.sources] == [2, 3]  # which results it rests on
        assert (eta.low, eta.high, eta.n) == (*values, 2)
        assert eta.value == pytest.approx(sum(values) / 2)
        assert eta.spread == pytest.approx((values[1] - values[0]) / eta.value)
        assert eta.left_out == ("1 cache-resident", "1 on a busy host")
        assert "left out: 1 cache-resident, 1 on a busy host" in eta.basis


def test_fit_shows_the_results_a_prediction_rests_on(strata_home: Path) -> None:
    from strata.hardware.cpu import probe_cpu
    from strata.hardware.profile import SoftwareStack
    from strata.measure.roofline import DeviceRoofline, Figure
    from strata.views.fit import prediction_lines

    host = HostProfile("h", probe_cpu(), [], SoftwareStack("3", "Linux", "0"))
    roof = Roofline([DeviceRoofline("cpu", "x", bandwidth={"triad": Figure(40.0, "m")},
                                    compute={"fp32": Figure(100.0, "m"),
                                             "int8": Figure(200.0, "m")})], 1.0)
    report = fit_model(resolve("synthetic:smollm2-135m@q4_0"), host, FitOptions(ctx=1024),
                       roof, EtaHistory.from_results(RECORDED, "llamacpp", LLC))
    pp = next(p for p in report.predictions if p.phase == "prefill")
    assert pp.low_tps == pytest.approx(pp.ceiling_tps * 0.58)  # the outlier sets no bound
    text = "\n".join(line.plain for line in prediction_lines(report))
    assert "η rests on: #2 llama-8b-q4_0.gguf pp512+tg128 η 0.58, #3" in text
    assert "spread 10% of the median" in text
    data = pp.to_dict()["eta"]
    assert [s["result_id"] for s in data["sources"]] == [2, 3] and data["spread"] > 0


def test_without_a_roofline_the_prediction_says_what_to_run(tmp_path: Path) -> None:
    report = fit_json("synthetic:smollm2-135m@q4_0", home=tmp_path)
    assert report["predictions"] == []
    assert any("strata probe --measure" in why for why in report["prediction_absent"])
    assert report["devices"][0]["device"] == "cpu" and report["rules"]
    assert report["fingerprint"]  # the host was probed (and nothing stored: fit only reads)


def test_fit_says_cannot_run_before_any_plan(tmp_path: Path) -> None:
    """-B lab on Q3_K weights (no lab op multiplies them): one line saying so, exit 2 —
    not "fits" with a predicted t/s and the missing kernels at the end."""
    proc = run_cli("fit", "synthetic:tiny-k@q3_k_m", "-B", "lab", home=tmp_path, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "cannot run on -B lab: no lab op multiplies Q3_K weights yet" in lines[0]
    assert "fits" not in proc.stdout
    ok = run_cli("fit", "synthetic:tiny-k@q4_k_m", "-B", "lab", home=tmp_path, timeout=120)
    assert ok.returncode == 0 and "fits" in ok.stdout, ok.stderr
    ring = run_cli("ring", "plan", "synthetic:tiny-k@q3_k_m", home=tmp_path, timeout=120)
    assert ring.returncode == 2 and "ring stages cannot run it with --ops lab" in ring.stderr


def test_default_context_is_the_models_own_when_shorter(tmp_path: Path) -> None:
    """No --ctx on a 2,048-token model: planned at 2,048 (llama.cpp would not run it at
    4,096), with no 'beyond the trained context' note; an asked --ctx is kept as asked."""
    plain = fit_json("synthetic:tiny@q8_0", home=tmp_path)
    assert plain["options"]["n_ctx"] == 2048, plain["options"]
    assert not any("beyond the model's trained context" in n for n in plain["notes"])
    asked = fit_json("synthetic:tiny@q8_0", "--ctx", "4096", home=tmp_path)
    assert asked["options"]["n_ctx"] == 4096
    assert any("beyond the model's trained context" in n for n in asked["notes"])
