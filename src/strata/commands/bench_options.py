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
from strata.bench.plan import BenchConfig, RepPolicy, load_grid
from strata.bench.scenario import build_tests, parse_int_list, parse_pairs
from strata.errors import InputError

KV_TYPES = ("f16", "f32", "bf16", "q8_0", "q4_0")  # llama.cpp's -ctk/-ctv types strata knows
QUANTISED_KV = ("q8_0", "q4_0")  # need flash attention as a V cache
DTYPES = ("auto", "float32", "bfloat16", "float16")


def backend_help() -> str:
    """`strata bench --backend` help, listed from the registry so it cannot go stale."""
    listed = ", ".join(f"{n} ({d.help})" for n, d in registry().items())
    named = [n for n, d in registry().items() if not d.auto]
    only = f" ({', '.join(named)}: only when named)" if named else ""
    return f"Comma list of {listed}; auto = every backend that can take the model{only}."


Opt = typer.Option


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
    backend: Annotated[str, Opt("--backend", "-B", help=escape(backend_help()))] = "auto"
    n_prompt: Annotated[str, Opt("-p", "--n-prompt", help="Prompt sizes (pp tests); 'none' to "
                                 "skip.")] = "512"
    n_gen: Annotated[str, Opt("-n", "--n-gen", help="Generation sizes (tg tests); 'none' to "
                              "skip.")] = "128"
    pg: Annotated[list[str] | None, Opt("-pg", "--pg", metavar="PROMPT,GEN",
                                        help="Combined pp+tg test (repeatable).")] = None
    depth: Annotated[str, Opt("-d", "--n-depth", help="Context already in the KV cache.")] = "0"
    batch: Annotated[str, Opt("-b", "--batch-size", help="llama.cpp n_batch.")] = "2048"
    ubatch: Annotated[str, Opt("-ub", "--ubatch-size", help="llama.cpp n_ubatch.")] = "512"
    threads: Annotated[str, Opt("-t", "--threads", help="CPU threads (default: physical "
                                "cores).")] = ""
    n_gpu_layers: Annotated[str, Opt("-ngl", "--n-gpu-layers", help="Layers offloaded to the "
                                     "GPU (llama.cpp).")] = "0"
    flash_attn: Annotated[str, Opt("-fa", "--flash-attn", help="0, 1 or 0,1 (llama.cpp).")] \
        = "0"
    kv_type: Annotated[str, Opt("-ctk", "--cache-type-k", help="K cache type: "
                                f"{', '.join(KV_TYPES)}.")] = "f16"
    kv_type_v: Annotated[str, Opt("-ctv", "--cache-type-v", help="V cache type: "
                                  f"{', '.join(KV_TYPES)}; quantised needs -fa 1.")] = "f16"
    device: Annotated[str, Opt("--device", help="torch device: cpu, cuda, cuda:1, mps.")] = "cpu"
    dtype: Annotated[str, Opt("--dtype", help=f"torch dtype: {', '.join(DTYPES)}.")] = "auto"
    reps: Annotated[str | None, Opt("-r", "--repetitions", metavar="N", help="Exactly N timed "
                                    "repetitions, one number (default: adaptive to "
                                    "--ci-target).")] = None
    ci_target: Annotated[float, Opt("--ci-target", help="Stop repeating once the 95% CI "
                                    "half-width is this fraction of the mean (0 to 1).")] = 0.02
    max_reps: Annotated[int, Opt("--max-reps", help="Most repetitions per test.")] = 10
    max_time: Annotated[float, Opt("--max-time", metavar="SECONDS", help="Most timed seconds "
                                   "per test.")] = 30.0
    delay: Annotated[float, Opt("--delay", metavar="SECONDS",
                                help="Cool down between tests.")] = 0.0
    sustained: Annotated[float | None, Opt("--sustained", metavar="SECONDS", help="Decode "
                                           "continuously: t/s timeline and throttling.")] = None
    model_name: Annotated[str | None, Opt("--model-name", help="Model id for an endpoint "
                                          "(default: the server's first).")] = None
    seed: Annotated[int, Opt("--seed", help="Seed for the random prompts.")] = 0


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
    """llama.cpp refuses a quantised V cache without flash attention: say which flag to add
    before anything loads, rather than relay the error of a context that failed."""
    if "llamacpp" not in backends:
        return  # other backends keep K/V in the model's dtype and ignore -ctk/-ctv
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

FORMATS_HELP = ("table", "md", "csv", "json", "jsonl", "sql")
