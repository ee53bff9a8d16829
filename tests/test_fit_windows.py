"""`strata fit` on sliding-window models: the KV cache as each backend allocates it.

Reference for llama.cpp: its own log of the same file (llama_kv_cache_iswa's "creating
non-SWA KV cache, size = N cells" and "creating SWA KV cache, size = M cells", and each
cache's "KV buffer size = X MiB") at several contexts, with and without --swa-full, read
with verbose=True — nothing of strata's sizing involved. For the lab: the cache strata's
executor really allocates (its tensors' bytes).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from strata.models.source import resolve
from tests.conftest import run_cli
from tests.seed_host import seed_host

pytest.importorskip("llama_cpp", reason="llama-cpp-python (the llamacpp extra) not installed")

PRESET = "synthetic:tiny-gemma3@f32"  # 7 layers, 6 of them windowed (16 positions)
_CELLS = re.compile(r"creating\s+(non-SWA|SWA) KV cache, size = (\d+) cells")
_MIB = re.compile(r"KV buffer size =\s+([\d.]+) MiB")


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fit-windows")
    seed_host(path)
    return path


def llama_cpp_kv(path: Path, ctx: int, swa_full: bool) -> tuple[dict[str, int], float]:
    """(cells per cache, total KV MiB) from llama.cpp's own log at n_ctx `ctx` (in a fresh
    process: its log callback is process-wide, and strata's backend quiets it)."""
    code = ("import sys; from llama_cpp import Llama; "
            f"Llama(model_path=sys.argv[1], n_ctx={ctx}, n_batch=2048, n_ubatch=512, "
            f"verbose=True, swa_full={swa_full}, n_threads=1).close()")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    cells = {kind: int(n) for kind, n in _CELLS.findall(r.stderr)}
    return cells, sum(float(m) for m in _MIB.findall(r.stderr))


def fit_kv(home: Path, ctx: int, *flags: str) -> tuple[int, list[str]]:
    r = run_cli("fit", PRESET, "--ctx", str(ctx), *flags, "--json", home=home)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    return out["devices"][0]["kv_bytes"], out["notes"]


@pytest.mark.parametrize("ctx", [40, 1000, 3000])
@pytest.mark.parametrize("swa_full", [False, True])
def test_llamacpp_kv_equals_llama_cpps_allocation(home: Path, ctx: int, swa_full: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_HOME", str(home))
    path = resolve(PRESET).path("gguf", "llamacpp")
    cells, mib = llama_cpp_kv(path, ctx, swa_full)
    got, notes = fit_kv(home, ctx, *(["--swa-full"] if swa_full else []))
    per_cell = 2 * 2 * 32 * 2  # K and V, 2 KV heads of 32, f16 (llama.cpp's default type)
    want = per_cell * (1 * cells["non-SWA"] + 6 * cells["SWA"])
    print(f"\nctx {ctx} swa_full {swa_full}: llama.cpp cells {cells}, {mib:.2f} MiB; "
          f"fit {got} B")
    assert got == want
    assert got / 2**20 == pytest.approx(mib, abs=0.01)  # its log prints 2 decimals
    assert any("6 of 7 layers see only the last 16 positions" in n for n in notes)
    if not swa_full and ctx >= 1000:  # the window saves memory only past it
        assert cells["SWA"] < cells["non-SWA"]


def test_lab_kv_equals_what_the_executor_allocates(home: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from strata.backends.lab import CTX_STEP
    from strata.engine import load

    monkeypatch.setenv("STRATA_HOME", str(home))
    path = resolve(PRESET).path("gguf", "lab")
    for kv, flags in (("f16", ()), ("f32", ("--kv-type", "f32")),  # -B lab's default: f16
                      ("q8_0", ("--kv-type", "q8_0"))):
        ex = load(path, ops="torch", kv=kv)
        for ctx in (40, 3000):
            ex.reset(-(-ctx // CTX_STEP) * CTX_STEP)  # what -B lab allocates for `ctx`
            assert ex.cache is not None
            got, _ = fit_kv(home, ctx, "-B", "lab", *flags)
            assert got == ex.cache.nbytes, (kv, ctx)


def test_swa_full_belongs_to_llama_cpp(home: Path) -> None:
    r = run_cli("fit", PRESET, "-B", "lab", "--swa-full", home=home)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--swa-full is llama.cpp's option" in r.stderr
