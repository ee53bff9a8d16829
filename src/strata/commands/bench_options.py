"""Turn `strata bench` flags into a validated BenchConfig (llama-bench flag semantics)."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, fields
from typing import Annotated, Any, get_type_hints

import typer
from rich.markup import escape

from strata.backends import registry
from strata.backends.base import LoadConfig
from strata.bench.load import (
    DEFAULT_SLO_ITL_MS,
    DEFAULT_SLO_TTFT_MS,
    MAX_WORKERS,
    LoadBenchConfig,
    LoadPlan,
    Slo,
    make_levels,
)
from strata.bench.plan import BenchConfig, RepPolicy, load_grid
from strata.bench.scenario import BenchTest, build_tests, parse_int_list, parse_pairs
from strata.errors import InputError

KV_TYPES = ("f16", "f32", "bf16", "q8_0", "q4_0")  # llama.cpp's -ctk/-ctv types strata knows
QUANTISED_KV = ("q8_0", "q4_0")  # need flash attention as a V cache
DTYPES = ("auto", "float32", "bfloat16", "float16")


def _or(words: tuple[str, ...]) -> str:
    """'a, b or c': a help cell's list that never wraps to a lone last word."""
    return f"{', '.join(words[:-1])} or {words[-1]}"


def backend_help() -> str:
    """`strata bench --backend` help, listed from the registry so it cannot go stale."""
    listed = ", ".join(f"{n} ({d.help})" for n, d in registry().items())
    named = [n for n, d in registry().items() if not d.auto]
    only = f" ({', '.join(named)}: only when named)" if named else ""
    return f"Comma list of {listed}; auto = every backend that can take the model{only}."


Opt = typer.Option
LOAD_PANEL = "Serving load (endpoints)"


@dataclass
class BenchFlags:
    """Every `strata bench` flag, spelled once: the CLI's signature is generated from these
    fields (`command_signature`), and build_config reads them."""

    models: Annotated[list[str] | None, typer.Argument(
        metavar="MODEL", help="file.gguf, a Hugging Face dir, synthetic:<preset>\\[@f32|f16|"
        "q8_0|q4_0], ollama:NAME\\[:TAG] (a model Ollama pulled), or http://host:port\\[/v1]. "
        "Default: the embedded synthetic preset.")] \
        = None
    model_opt: Annotated[list[str] | None, Opt("-m", "--model", metavar="MODEL", help="A model "
                                              "as llama-bench takes it (repeatable); runs after "
                                              "any positional MODEL.")] = None
    backend: Annotated[str, Opt("--backend", "-B", metavar="BACKEND",
                                 help=escape(backend_help()))] = "auto"
    n_prompt: Annotated[str, Opt("-p", "--n-prompt", metavar="N[,N...]",
                                 help="Sizes of the pp tests, or none.")] = "512"
    n_gen: Annotated[str, Opt("-n", "--n-gen", metavar="N[,N...]",
                              help="Sizes of the tg tests, or none.")] = "128"
    pg: Annotated[list[str] | None, Opt("-pg", "--pg", metavar="PROMPT,GEN",
                                        help="Combined pp+tg test (repeatable).")] = None
    depth: Annotated[str, Opt("-d", "--n-depth", metavar="N[,N...]",
                              help="Context already in the KV cache.")] = "0"
    batch: Annotated[str, Opt("-b", "--batch-size", metavar="N[,N...]",
                              help="llama.cpp n_batch.")] = "2048"
    ubatch: Annotated[str, Opt("-ub", "--ubatch-size", metavar="N[,N...]",
                               help="llama.cpp n_ubatch.")] = "512"
    threads: Annotated[str, Opt("-t", "--threads", metavar="N[,N...]",
                                help="CPU threads (default: physical cores).")] = ""
    n_gpu_layers: Annotated[str, Opt("-ngl", "--n-gpu-layers", metavar="N[,N...]",
                                     help="Layers on the GPU (llama.cpp).")] = "0"
    flash_attn: Annotated[str, Opt("-fa", "--flash-attn", metavar="0|1[,...]",
                                   help="0, 1 or 0,1 (llama.cpp).")] = "0"
    kv_type: Annotated[str, Opt("-ctk", "--cache-type-k", metavar="TYPE[,...]",
                                help=f"K cache type, one or more of {_or(KV_TYPES)}.")] = "f16"
    kv_type_v: Annotated[str, Opt("-ctv", "--cache-type-v", metavar="TYPE[,...]",
                                  help=f"V cache type: {', '.join(KV_TYPES)}; quantised "
                                  "needs -fa 1.")] = "f16"
    device: Annotated[str, Opt("--device", help="torch device: cpu, cuda, cuda:1, mps.")] = "cpu"
    dtype: Annotated[str, Opt("--dtype", help=f"torch dtype: {_or(DTYPES)}.")] = "auto"
    reps: Annotated[str | None, Opt("-r", "--repetitions", metavar="N", help="Exactly N timed "
                                    "repetitions, one number (default: as many as "
                                    "--ci-target needs).")] = None
    ci_target: Annotated[float, Opt("--ci-target", help="Stop repeating once the 95% CI "
                                    "half-width is this fraction of the mean (0 to 1).")] = 0.02
    max_reps: Annotated[int, Opt("--max-reps", help="Most repetitions per test.")] = 10
    max_time: Annotated[float, Opt("--max-time", metavar="SECONDS", help="Most timed seconds "
                                   "per test.")] = 30.0
    delay: Annotated[float, Opt("--delay", metavar="SECONDS",
                                help="Cool down between tests.")] = 0.0
    sustained: Annotated[float | None, Opt("--sustained", metavar="SECONDS", help="Decode "
                                           "continuously for SECONDS: t/s over time, "
                                           "throttling.")] = None
    model_name: Annotated[str | None, Opt("--model-name", help="Model id for an endpoint "
                                          "(default: the server's first).")] = None
    seed: Annotated[int, Opt("--seed", help="Seed for the random prompts (and arrival "
                             "times).")] = 0
    concurrency: Annotated[str | None, Opt(
        "--concurrency", metavar="C", rich_help_panel=LOAD_PANEL,
        help="Serving load on an endpoint: C requests in flight at once; each level "
        "(e.g. 1,2,4,8) is one timed window of requests.")] = None
    request_rate: Annotated[str | None, Opt(
        "--request-rate", metavar="R", rich_help_panel=LOAD_PANEL,
        help="Poisson arrivals, R requests/s (a list sweeps); --concurrency then caps "
        "those in flight.")] = None
    num_requests: Annotated[int | None, Opt(
        "--num-requests", metavar="N", rich_help_panel=LOAD_PANEL,
        help="Requests per level (default 4 x C, at least 8; with a rate, about 10 s of "
        "arrivals).")] = None
    slo_ttft_ms: Annotated[float | None, Opt(
        "--slo-ttft-ms", metavar="MS", rich_help_panel=LOAD_PANEL,
        help=f"Goodput SLO: time to first token (default {DEFAULT_SLO_TTFT_MS:g}).")] = None
    slo_itl_ms: Annotated[float | None, Opt(
        "--slo-itl-ms", metavar="MS", rich_help_panel=LOAD_PANEL,
        help="Goodput SLO: a request's mean inter-token latency (default "
        f"{DEFAULT_SLO_ITL_MS:g}).")] = None


def command_signature(cls: type, extra: list[inspect.Parameter]) -> \
        tuple[inspect.Signature, dict[str, Any]]:
    """(signature, annotations) for a typer command whose parameters are `cls`'s fields
    followed by `extra`: typer reads both from the function object."""
    hints = get_type_hints(cls, include_extras=True)
    params = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                annotation=hints[f.name]) for f in fields(cls)]
    params += extra
    return inspect.Signature(params), {p.name: p.annotation for p in params}


def _words(flag: str, text: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    items = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in items if allowed and w not in allowed]
    if bad or not items:
        raise InputError(f"{flag} {text}: expected one or more of {', '.join(allowed or ())}")
    return items


def choose_backends(flag: str, models: list[str]) -> list[str]:
    """'auto': every backend that can take at least one of the given models."""
    if flag != "auto":
        return _words("--backend", flag, tuple(registry()))
    endpoints = [m for m in models if m.startswith(("http://", "https://"))]
    files = len(models) - len(endpoints)
    return [b for b, d in registry().items() if d.auto and (
            (files and set(d.accepts) & {"gguf", "hf"})
            or (endpoints and "endpoint" in d.accepts))]


def _positive(flag: str, value: float, allow_zero: bool = False) -> None:
    if not math.isfinite(value):  # nan passes every comparison below; inf never ends
        raise InputError(f"{flag} {value}: must be a finite number")
    if value < 0 or (value == 0 and not allow_zero):
        raise InputError(f"{flag} {value:g}: must be {'>= 0' if allow_zero else '> 0'}")


def _fraction(flag: str, value: float) -> None:
    """A share of the mean: strictly between 0 and 1 (1 would accept any spread)."""
    if not (math.isfinite(value) and 0 < value < 1):
        raise InputError(f"{flag} {value:g}: must be between 0 and 1 (e.g. 0.02 = 2%)")


def _reps(text: str | None) -> int | None:
    """-r is one number, as in llama-bench (repetitions are not swept)."""
    if text is None:
        return None
    try:
        n = int(text.strip())
    except ValueError:
        raise InputError(f"-r {text}: repetitions take one number, e.g. -r 5 (not a list or "
                         "range)") from None
    if not 1 <= n <= 1000:
        raise InputError(f"-r {n}: repetitions must be between 1 and 1000")
    return n


def _flash_attn(text: str) -> list[bool]:
    values = parse_int_list("-fa", text, 0)
    bad = [v for v in values if v not in (0, 1)]
    if bad:
        raise InputError(f"-fa {text}: flash attention is 0 (off) or 1 (on), got {bad[0]}")
    return [bool(v) for v in values]


def _loads(f: BenchFlags) -> list[LoadConfig]:
    threads = parse_int_list("-t", f.threads, 1) if f.threads else []
    grid = load_grid(
        threads=threads, n_gpu_layers=parse_int_list("-ngl", f.n_gpu_layers, 0),
        batch=parse_int_list("-b", f.batch, 1), ubatch=parse_int_list("-ub", f.ubatch, 1),
        flash_attn=_flash_attn(f.flash_attn), kv_type=_words("-ctk", f.kv_type, KV_TYPES),
        kv_type_v=_words("-ctv", f.kv_type_v, KV_TYPES), device=_words("--device", f.device),
        dtype=_words("--dtype", f.dtype, DTYPES))
    if len(grid) > 256:
        raise InputError(f"the flags ask for {len(grid)} load configurations; narrow the sweep")
    return grid


def _check_v_cache(loads: list[LoadConfig], backends: list[str]) -> None:
    """llama.cpp refuses a quantised V cache without flash attention, -B lab and -B ring any
    K/V pair but f16, f32 or q8_0 for both: say so before anything loads, rather than relay
    the error of a context that failed midway through the sweep."""
    from strata.backends.descriptors.lab import KV_TYPES

    for name in sorted({"lab", "ring"} & set(backends)):  # strata's engine: f16, f32, q8_0
        for lc in loads:
            given = f"-ctk {lc.kv_type} -ctv {lc.kv_type_v}"
            if not {lc.kv_type, lc.kv_type_v} <= set(KV_TYPES):
                raise InputError(f"{given}: -B {name} keeps K/V in {', '.join(KV_TYPES)} "
                                 "(other types: -B llamacpp)")
            if lc.kv_type != lc.kv_type_v:
                raise InputError(f"{given}: -B {name} keeps K and V in one type; give -ctk "
                                 "and -ctv the same one value (a -ctk/-ctv sweep runs every "
                                 "pair)")
    if "llamacpp" not in backends:
        return  # torch keeps K/V in the model's dtype and ignores -ctk/-ctv
    bad = next((lc for lc in loads if lc.kv_type_v in QUANTISED_KV and not lc.flash_attn),
               None)
    if bad is not None:
        raise InputError(f"-ctv {bad.kv_type_v}: llama.cpp needs flash attention for a "
                         "quantised V cache; add -fa 1")


def _models(f: BenchFlags) -> list[str]:
    """The positional MODELs, then the -m ones (each once, first mention wins)."""
    from strata.models.presets import default_model

    given = [*(f.models or []), *(f.model_opt or [])]
    return list(dict.fromkeys(given)) or [default_model()]


def build_config(f: BenchFlags) -> BenchConfig:
    if _load_mode(f):
        return build_load_config(f)
    for flag, value, zero in (("--max-time", f.max_time, False), ("--delay", f.delay, True),
                              ("--max-reps", f.max_reps, False)):
        _positive(flag, value, zero)
    _fraction("--ci-target", f.ci_target)
    if f.sustained is not None:
        _positive("--sustained", f.sustained)
    reps_n = _reps(f.reps)
    tests = build_tests(parse_int_list("-p", f.n_prompt, 1), parse_int_list("-n", f.n_gen, 1),
                        parse_pairs("-pg", f.pg or []), parse_int_list("-d", f.depth, 0) or [0])
    reps = RepPolicy.fixed(reps_n) if reps_n else RepPolicy(
        max_reps=f.max_reps, target_rel_ci=f.ci_target, max_time_s=f.max_time,
        min_reps=min(3, f.max_reps))
    models = _models(f)
    backends = choose_backends(f.backend, models)
    loads = _loads(f)
    _check_v_cache(loads, backends)
    return BenchConfig(models=models, backends=backends, tests=tests, loads=loads, reps=reps,
                       model_name=f.model_name, delay_s=f.delay, sustained_s=f.sustained,
                       seed=f.seed)

_LOAD_ONLY = (("--num-requests", "num_requests"), ("--slo-ttft-ms", "slo_ttft_ms"),
              ("--slo-itl-ms", "slo_itl_ms"))


def _load_mode(f: BenchFlags) -> bool:
    if f.concurrency is not None or f.request_rate is not None:
        return True
    given = [flag for flag, name in _LOAD_ONLY if getattr(f, name) is not None]
    if given:
        raise InputError(f"{given[0]}: only with --concurrency or --request-rate (serving "
                         "load on an endpoint)")
    return False


def _is_endpoint(model: str) -> bool:
    return model.startswith(("http://", "https://", "ollama:"))


def _rates(text: str) -> list[float]:
    try:
        rates = [float(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise InputError(f"--request-rate {text}: expected requests per second, e.g. 2 or "
                         "0.5,1,2") from None
    if not rates:
        raise InputError(f"--request-rate {text}: expected one or more rates")
    for r in rates:
        _positive("--request-rate", r)
    return sorted(set(rates))


def build_load_config(f: BenchFlags) -> LoadBenchConfig:
    """--concurrency / --request-rate: request shapes (pp N + tg M) at load levels on an
    endpoint (bench/load.py). Flags that only mean something for one request are refused."""
    flag = "--concurrency" if f.concurrency is not None else "--request-rate"
    models = _models(f)
    local = next((m for m in models if not _is_endpoint(m)), None)
    if local is not None:
        raise InputError(f"{flag}: serving load needs an endpoint (http://host:port or "
                         f"ollama:NAME); {local} is not one")
    if f.backend not in ("auto", "openai"):
        raise InputError(f"{flag}: serving load runs on the openai backend (-B openai), "
                         f"not -B {f.backend}")
    for bad, why in ((f.sustained is not None, "--sustained"),
                     (f.reps is not None, "-r (a level is one window of --num-requests)"),
                     (any(parse_int_list("-d", f.depth, 0)), "-d (each request is a fresh "
                      "prompt)")):
        if bad:
            raise InputError(f"{flag}: {why} does not apply to serving load")
    concurrency = parse_int_list("--concurrency", f.concurrency or "", 1)
    if f.concurrency is not None and not concurrency:
        raise InputError(f"--concurrency {f.concurrency}: expected one or more counts, e.g. "
                         "1,2,4,8")
    rates = _rates(f.request_rate) if f.request_rate is not None else []
    if f.num_requests is not None and not 1 <= f.num_requests <= 10_000:
        raise InputError(f"--num-requests {f.num_requests}: must be between 1 and 10000")
    for name, value in (("--slo-ttft-ms", f.slo_ttft_ms), ("--slo-itl-ms", f.slo_itl_ms)):
        if value is not None:
            _positive(name, value)
    levels = make_levels(concurrency, rates, f.num_requests)
    for lv in levels:
        if lv.concurrency and lv.concurrency > lv.requests:
            raise InputError(f"--num-requests {lv.requests} is below --concurrency "
                             f"{lv.concurrency}: that level would never have "
                             f"{lv.concurrency} requests in flight")
        if lv.workers > MAX_WORKERS:
            raise InputError(f"{lv.name}: {lv.workers} requests in flight at once; at most "
                             f"{MAX_WORKERS} (cap them with --concurrency)")
    shapes = _shapes(f)
    slo = Slo(f.slo_ttft_ms or DEFAULT_SLO_TTFT_MS, f.slo_itl_ms or DEFAULT_SLO_ITL_MS)
    _positive("--delay", f.delay, True)
    return LoadBenchConfig(models=models, backends=["openai"], tests=shapes,
                           loads=[LoadConfig()], reps=RepPolicy.fixed(1),
                           model_name=f.model_name, delay_s=f.delay, seed=f.seed,
                           load=LoadPlan(levels, slo))


def _shapes(f: BenchFlags) -> list[BenchTest]:
    """Every request is a prompt of -p tokens that asks for -n tokens (each pair of the
    lists, then every -pg pair)."""
    prompts, gens = parse_int_list("-p", f.n_prompt, 1), parse_int_list("-n", f.n_gen, 1)
    pairs = [(p, n) for p in prompts for n in gens] + parse_pairs("-pg", f.pg or [])
    if not pairs:
        raise InputError("serving load: each request needs a prompt and generated tokens "
                         "(-p N -n M, or -pg N,M)")
    bad = next(((p, n) for p, n in pairs if p < 1 or n < 1), None)
    if bad:
        raise InputError(f"serving load: a request of {bad[0]} prompt and {bad[1]} generated "
                         "tokens; both must be at least 1")
    return [BenchTest(p, n) for p, n in dict.fromkeys(pairs)]


FORMATS_HELP = ("table", "md", "csv", "json", "jsonl", "sql")
