"""One flat record per stored result: the schema every printer reads
(docs/architecture.md §6).

Field names follow llama-bench's JSON/CSV output where a field maps (model_filename,
n_prompt, n_gen, n_depth, avg_ts, stddev_ts, samples_ts, avg_ns, ...); strata's own fields
(backend, eta, bound, ttft_ms, ...) are added next to them.

llama-bench's build and device fields, per backend:
  build_commit, build_number  llama.cpp's build (llamacpp rows); None on other backends,
                              whose engine is not llama.cpp (strata's own commit is the run's
                              git_commit). build_number is None everywhere: see
                              backends.llamacpp_info.build_info.
  cpu_info, gpu_info          the CPU's and the GPUs' names as the engine sees them ("" when
                              no GPU); None for an endpoint (the server's hardware is unknown).
  backends                    llama.cpp's compiled ggml backends (llama-bench's rule); on torch
                              the device kind the run used (CPU, CUDA, ROCm, MPS).
A setting the backend does not read (n_gpu_layers on torch, dtype on llama.cpp, any on an
endpoint) is None, not the flag's unused default; torch rows carry the dtype and device they
ran in, and their K/V type is the cache's real dtype.
"""

from __future__ import annotations

import functools
from typing import Any

from strata.backends import describe
from strata.bench.scenario import BenchTest
from strata.errors import InputError
from strata.store.runs import StoredResult

PRIMARY = {"pp": "prefill_tps", "tg": "decode_tps", "pg": "combined_tps"}

# Load settings a run can sweep, as (record field, short header), in llama-bench's column
# order (-ctk and -ctv sweep apart, so each has a column). Depth needs none: it is part of
# the test name (pp512@d4096).
SETTINGS: tuple[tuple[str, str], ...] = (
    ("n_gpu_layers", "ngl"), ("n_threads", "threads"), ("n_batch", "batch"),
    ("n_ubatch", "ubatch"), ("type_k", "type_k"), ("type_v", "type_v"), ("flash_attn", "fa"),
    ("device", "device"), ("dtype", "dtype"))

# record field -> the LoadConfig field it shows (n_threads comes from the backend's info)
_LOAD_FIELD = {"n_gpu_layers": "n_gpu_layers", "n_batch": "batch", "n_ubatch": "ubatch",
               "flash_attn": "flash_attn", "type_k": "kv_type", "type_v": "kv_type_v",
               "device": "device", "dtype": "dtype"}


def _primary(r: StoredResult) -> dict[str, Any]:
    kind = BenchTest(r.n_prompt, r.n_gen, r.n_depth).kind
    return r.metrics.get(PRIMARY[kind], {})


def _ms(r: StoredResult, metric: str, stat: str) -> float | None:
    value = r.metrics.get(metric, {}).get(stat)
    return value * 1e3 if value is not None else None


def record(r: StoredResult) -> dict[str, Any]:
    prim = _primary(r)
    e2e = r.metrics.get("e2e_s", {})
    model = r.info.get("model", {})
    lc = r.load_config
    ex = r.explain or {}
    verdict = (r.telemetry or {}).get("verdict", {})
    load = (r.telemetry or {}).get("host_load") or {}
    kind = BenchTest(r.n_prompt, r.n_gen, r.n_depth).kind
    eta = ex.get("prefill_eta") if kind == "pp" else ex.get("decode_eta")
    settings = _settings(r)
    return {
        # llama-bench fields, in llama-bench's order
        **_build(r),
        "model_filename": r.model, "model_type": _model_type(model),
        "model_size": model.get("weight_bytes"), "model_n_params": model.get("params"),
        "n_batch": settings["n_batch"], "n_ubatch": settings["n_ubatch"],
        "n_threads": r.info.get("threads", lc.get("threads")),
        "type_k": settings["type_k"], "type_v": settings["type_v"],
        "n_gpu_layers": settings["n_gpu_layers"], "flash_attn": settings["flash_attn"],
        "device": settings["device"], "dtype": settings["dtype"],
        "n_prompt": r.n_prompt, "n_gen": r.n_gen, "n_depth": r.n_depth,
        "test_time": _iso_utc(r.created_at),
        "avg_ns": e2e.get("mean", 0) * 1e9, "stddev_ns": e2e.get("sd", 0) * 1e9,
        "avg_ts": prim.get("mean"), "stddev_ts": prim.get("sd"),
        "samples_ns": [s * 1e9 for s in e2e.get("samples", [])],
        "samples_ts": prim.get("samples", []),
        # strata fields
        "backend": r.backend, "test": r.test, "n": prim.get("n"),
        "prefill_ts": r.metrics.get("prefill_tps", {}).get("mean"),
        "decode_ts": r.metrics.get("decode_tps", {}).get("mean"),
        "ttft_ms": _ms(r, "ttft_s", "mean"), "tpot_ms": _ms(r, "tpot_s", "mean"),
        "itl_p50_ms": _ms(r, "itl_s", "median"), "itl_p90_ms": _ms(r, "itl_s", "p90"),
        "itl_p99_ms": _ms(r, "itl_s", "p99"), "e2e_ms": _ms(r, "e2e_s", "mean"),
        "eta": eta, "bound": ex.get("bound"),
        "decode_ceiling_ts": ex.get("decode_ceiling_tps"),
        "prefill_ceiling_ts": ex.get("prefill_ceiling_tps"),
        # the ceiling this test is judged against: prefill for pp, decode for tg and pp+tg
        "ceiling_ts": ex.get("prefill_ceiling_tps" if kind == "pp" else "decode_ceiling_tps"),
        "bytes_per_token": ex.get("bytes_per_token"),
        "peak_rss_bytes": _int(r.info.get("memory", {}).get("peak_proc.rss_bytes")),
        "throttled": verdict.get("throttled"),
        # other processes' CPU use during the test (HostLoadMonitor); None: not recorded
        "host_busy": load.get("busy"), "host_busy_share": load.get("busy_share"),
        "stop_reason": r.info.get("stop_reason"),
        "notes": (_busy_note(load, ex) + r.info.get("notes", []) + ex.get("verdict", [])
                  + _peak_notes(r) + _sustained_note(r) + _throttle_note(verdict)),
        "sustained": r.info.get("sustained"),
        **_latency(r), **_load(r),
    }


# Serving-load fields (bench/load.py): one record per level; None on a single-request test.
LOAD_FIELDS = ("concurrency", "request_rate", "requests", "failed", "window_s", "output_tokens",
               "output_ts", "requests_ps", "slo_ttft_ms", "slo_itl_ms", "goodput_rps",
               "goodput_share", "in_flight_max", "server_parallel")
_LOAD_KEYS = {"output_ts": "output_tps"}  # record field -> info["load"] key where they differ


def _latency(r: StoredResult) -> dict[str, Any]:
    """TTFT and E2E percentiles over the stored samples (repetitions, or a load level's
    requests)."""
    out = {}
    for metric, name in (("ttft_s", "ttft"), ("e2e_s", "e2e")):
        for stat, suffix in (("median", "p50"), ("p90", "p90"), ("p99", "p99")):
            out[f"{name}_{suffix}_ms"] = _ms(r, metric, stat)
    return out


def _load(r: StoredResult) -> dict[str, Any]:
    load = r.info.get("load") or {}
    return {name: load.get(_LOAD_KEYS.get(name, name)) for name in LOAD_FIELDS}


def _settings(r: StoredResult) -> dict[str, Any]:
    """Each load setting as this backend ran it: what it reports in info() first (torch's
    real dtype and device), else the configured value if the backend reads that setting,
    else None."""
    reads = _reads(r.backend)
    lc, info = r.load_config, r.info
    out = {name: lc.get(key) if key in reads else None for name, key in _LOAD_FIELD.items()}
    for name in ("device", "dtype"):
        if info.get(name) is not None:
            out[name] = info[name]
    if info.get("kv_dtype"):  # torch: the cache holds K and V in this dtype
        out["type_k"] = out["type_v"] = info["kv_dtype"]
    return out


@functools.cache
def _reads(backend: str) -> frozenset[str]:
    """The LoadConfig fields `backend` reads; all of them for a backend this strata no longer
    has (its stored settings are then shown as stored)."""
    try:
        reads = set(describe(backend).options)
    except InputError:
        return frozenset(_LOAD_FIELD.values())
    if "kv_type" in reads:  # K and V types go together: a backend reading one reads both
        reads.add("kv_type_v")
    return frozenset(reads)


def _build(r: StoredResult) -> dict[str, Any]:
    """llama-bench's build and device fields, as the backend reported them (module doc)."""
    return {k: r.info.get(k) for k in ("build_commit", "build_number", "cpu_info",
                                       "gpu_info", "backends")}


def _iso_utc(stamp: str) -> str | None:
    """test_time as llama-bench writes it (2026-01-31T12:00:00Z); None if never stored."""
    return stamp.replace("+00:00", "Z") if stamp else None


def _int(value: Any) -> int | None:
    """A byte count as an int (telemetry samples are floats; docs/output.md: *_bytes int)."""
    return None if value is None else int(value)


def swept(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The SETTINGS whose value differs between `records`: each earns a column in every
    table (terminal, md, HTML), as llama-bench prints a field that was swept. Without it,
    `-t 1-2` prints rows that differ only in t/s. None (a backend that does not have the
    setting, e.g. an endpoint's threads) is not a value of its own."""
    return [(name, header) for name, header in SETTINGS
            if len({repr(r.get(name)) for r in records if r.get(name) is not None}) > 1]


def setting_text(value: Any) -> str:
    """A setting as a table cell: flags as llama-bench prints them (fa 0/1), absent as '-'."""
    if value is None:
        return "-"
    return str(int(value)) if isinstance(value, bool) else str(value)


def _busy_note(load: dict[str, Any], ex: dict[str, Any]) -> list[str]:
    """The busy-host verdict, unless explain's η verdict already leads with it."""
    text = load.get("verdict")
    if not load.get("busy") or not text:
        return []
    if any(text in v for v in ex.get("verdict", [])):
        return []
    return [f"{text} — these figures understate what this host does when quiet"]


def _peak_notes(r: StoredResult) -> list[str]:
    notes = [c["note"] for c in r.info.get("peak_checks", []) if c.get("note")]
    if r.info.get("eta_recomputed"):
        notes.append(f"η recomputed: {r.info['eta_recomputed']}")
    return notes


def _throttle_note(verdict: dict[str, Any]) -> list[str]:
    if verdict.get("throttled"):
        return ["throttling seen during this test: " + "; ".join(verdict.get("evidence", []))]
    return []


def _sustained_note(r: StoredResult) -> list[str]:
    s = r.info.get("sustained")
    if not s or s.get("drop") is None:
        return []
    flags = {True: "throttling seen", False: "no throttling seen", None: "throttling unknown"}
    return [f"sustained {s['seconds']:g} s: first {s['window_s']:g} s {s['first_tps']:.2f} t/s, "
            f"last {s['window_s']:g} s {s['last_tps']:.2f} t/s (drop {s['drop']:+.1%}); "
            f"{flags[s.get('throttled')]}"]


def _model_type(model: dict[str, Any]) -> str | None:
    if "arch" not in model:
        return None
    params = model.get("params") or 0
    return f"{model['arch']} {params_text(params)} {model.get('dtype', '?')}"


def params_text(params: float) -> str:
    """A parameter count as people name models: 1.2B, 135M, 260K (a 260K model is not
    "0M", as llama.cpp's "?B (guessed)" is not a size)."""
    for scale, unit, spec in ((1e9, "B", ".1f"), (1e6, "M", ".0f"), (1e3, "K", ".0f")):
        if params >= scale:
            return f"{params / scale:{spec}}{unit}"
    return f"{params:.0f}"
