"""`import strata`: the documented API (strata.api's probe, bench, fit, quality; kernels;
lab), each called for real, with docstrings, and no heavy import up front."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import strata
from tests.seed_host import seed_host

TINY = "synthetic:tiny@f16"  # 2 layers x 64: a few MB, llama.cpp loads it in well under 1 s


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A STRATA_HOME that knows this host and a seeded roofline (no 10-30 s measurement)."""
    home = tmp_path_factory.mktemp("api")
    seed_host(home)
    return home


@pytest.fixture
def env_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STRATA_HOME", str(home))
    return home


def test_import_is_light_and_lists_the_api() -> None:
    """A fresh interpreter: `import strata` and looking the functions up import neither
    torch nor llama.cpp; `dir(strata)` names the API."""
    code = ("import sys, strata; fns = [strata.api.probe, strata.api.bench, strata.api.fit, "
            "strata.api.quality, strata.kernels.get, strata.kernels.implementations]; "
            "import json; print(json.dumps({'heavy': sorted(m for m in ('torch', 'llama_cpp') "
            "if m in sys.modules), 'dir': dir(strata), 'all': strata.__all__}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["heavy"] == []
    assert {"api", "kernels", "lab", "InputError"} <= set(seen["all"])
    assert seen["dir"] == sorted(seen["all"])  # the API only: no Any, sys, import_module


@pytest.mark.parametrize("name", ["probe", "bench", "fit", "quality"])
def test_each_function_is_documented_with_its_signature(name: str) -> None:
    fn = getattr(strata.api, name)
    assert callable(fn)
    doc = fn.__doc__ or ""
    assert len(doc.split()) >= 20, f"strata.api.{name} has no real docstring"
    assert "model" in inspect.signature(fn).parameters or name == "probe"
    assert strata.__doc__ and f"api.{name}(" in strata.__doc__


def test_kernels_api_is_documented() -> None:
    for name in ("get", "implementations", "verify", "add", "remove", "abi_path"):
        fn = getattr(strata.kernels, name)
        assert fn.__doc__ and len(fn.__doc__.split()) >= 10, name


def test_the_packages_are_plain_packages_and_the_functions_live_in_api() -> None:
    """strata.fit/bench/quality are only the packages (no module-class rewrite); the
    functions are strata.api's."""
    import types

    import strata.bench.plan
    import strata.fit.plan
    import strata.quality

    for pkg in (strata.fit, strata.bench, strata.quality):
        assert type(pkg) is types.ModuleType and not callable(pkg)
    assert strata.fit.fit_model is strata.fit.plan.fit_model
    assert all(callable(getattr(strata.api, f)) for f in ("probe", "bench", "fit", "quality"))


def test_probe_returns_this_hosts_profile() -> None:
    profile = strata.api.probe()
    assert profile.cpu.arch and (profile.cpu.logical_threads or 0) >= 1
    assert profile.to_dict()["cpu"]["arch"] == profile.cpu.arch
    assert profile.software is not None


def test_fit_plans_a_synthetic_preset(env_home: Path) -> None:
    report = strata.api.fit(TINY, ctx=256)
    data = report.to_dict()
    assert data["devices"], data
    cpu = next(d for d in data["devices"] if d["device"] == "cpu")
    assert cpu["verdict"] == "fits"  # a few MB of weights on any host


def test_fit_refuses_a_bad_argument_like_the_cli(env_home: Path) -> None:
    from strata.errors import InputError

    with pytest.raises(InputError, match=r"^kv_type=q7_9: choose one of"):
        strata.api.fit(TINY, kv_type="q7_9")  # the parameter's name, not the CLI's --kv-type
    with pytest.raises(strata.InputError, match=r"^ctx=0: must be between"):
        strata.api.fit(TINY, ctx=0)
    with pytest.raises(strata.InputError, match=r"^on=rtx 409: not in the device catalogue"):
        strata.api.whatif(TINY, on="rtx 409")


def test_results_convert_to_records_and_pandas_with_the_documented_names(
        env_home: Path) -> None:
    from tests.test_output_schema import check

    rows = strata.api.whatif("synthetic:llama-3.1-8b@q4_k_m", on=["rtx-4090", "rx-9070-xt"])
    assert isinstance(rows, list) and len(rows) == 2
    for rec in rows.to_records():
        check(rec, "whatif")
    html = rows._repr_html_()
    assert html.count("<tr>") == 3 and "<th>predicted_decode_ts</th>" in html
    df = rows.to_pandas()
    assert list(df["device"]) == ["rtx-4090", "rx-9070-xt"]
    plan = strata.api.fit(TINY, ctx=256)
    assert plan.to_records() == plan.records()
    assert set(plan.to_pandas().columns) == set(plan.records()[0])


def test_bench_runs_llamacpp_and_returns_llama_bench_records(env_home: Path) -> None:
    rows = strata.api.bench(TINY, backend="llamacpp", n_prompt=16, n_gen=4, reps=1)
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(16, 0), (0, 4)]
    assert all(r["model_filename"] == TINY and r["avg_ts"] > 0 for r in rows)
    with pytest.raises(Exception, match="n_promt"):  # a misspelt option is named
        strata.api.bench(TINY, backend="llamacpp", n_promt=16)


def test_quality_scores_a_synthetic_preset(env_home: Path) -> None:
    [result] = strata.api.quality(TINY, backend="llamacpp", ctx=64, max_chunks=1)
    row = result.to_dict()
    assert row["backend"] == "llamacpp" and row["ctx"] == 64
    assert row["ppl"] > 1  # a random model is a poor one, but its perplexity is measured


def test_kernels_lists_implementations(env_home: Path) -> None:
    rows = strata.kernels.implementations("rmsnorm")
    assert rows and all(r["op"] == "rmsnorm" for r in rows)
    assert {"impl", "dialect", "available", "verified", "origin"} <= set(rows[0])
    assert strata.kernels.abi_path().is_file()
