"""Turn `strata bench` flags into a validated BenchConfig (llama-bench flag semantics)."""

from __future__ import annotations

from dataclasses import dataclass

from strata.backends import registry
from strata.backends.base import LoadConfig
from strata.bench.plan import BenchConfig, RepPolicy, load_grid
from strata.bench.scenario import build_tests, parse_int_list, parse_pairs
from strata.errors import InputError

KV_TYPES = ("f16", "q8_0", "q4_0")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class BenchFlags:
    models: list[str]
    backend: str
    n_prompt: str
    n_gen: str
    pg: list[str]
    depth: str
    batch: str
    ubatch: str
    threads: str
    n_gpu_layers: str
    flash_attn: str
    kv_type: str
    device: str
    dtype: str
    reps: int | None
    ci_target: float
    max_reps: int
    max_time: float
    delay: float
    sustained: float | None
    model_name: str | None
    seed: int


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
    return [b for b, d in registry().items()
            if (files and set(d.accepts) & {"gguf", "hf"})
            or (endpoints and "endpoint" in d.accepts)]


def backend_help() -> str:
    """`strata bench --backend` help, listed from the registry so it cannot go stale."""
    listed = ", ".join(f"{n} ({d.help})" for n, d in registry().items())
    return f"Comma list of {listed}; auto = every backend that can take the model."


def _positive(flag: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise InputError(f"{flag} {value:g}: must be {'>= 0' if allow_zero else '> 0'}")


def _loads(f: BenchFlags) -> list[LoadConfig]:
    threads = parse_int_list("-t", f.threads, 1) if f.threads else []
    grid = load_grid(
        threads=threads, n_gpu_layers=parse_int_list("-ngl", f.n_gpu_layers, 0),
        batch=parse_int_list("-b", f.batch, 1), ubatch=parse_int_list("-ub", f.ubatch, 1),
        flash_attn=[bool(v) for v in parse_int_list("-fa", f.flash_attn, 0)],
        kv_type=_words("-ctk", f.kv_type, KV_TYPES), device=_words("--device", f.device),
        dtype=_words("--dtype", f.dtype, DTYPES))
    if len(grid) > 256:
        raise InputError(f"the flags ask for {len(grid)} load configurations; narrow the sweep")
    return grid


def build_config(f: BenchFlags) -> BenchConfig:
    for flag, value, zero in (("--ci-target", f.ci_target, False), ("--max-time", f.max_time,
                              False), ("--delay", f.delay, True), ("--max-reps", f.max_reps,
                              False)):
        _positive(flag, value, zero)
    if f.sustained is not None:
        _positive("--sustained", f.sustained)
    if f.reps is not None and not 1 <= f.reps <= 1000:
        raise InputError(f"-r {f.reps}: repetitions must be between 1 and 1000")
    tests = build_tests(parse_int_list("-p", f.n_prompt, 1), parse_int_list("-n", f.n_gen, 1),
                        parse_pairs("-pg", f.pg), parse_int_list("-d", f.depth, 0) or [0])
    reps = RepPolicy.fixed(f.reps) if f.reps else RepPolicy(
        max_reps=f.max_reps, target_rel_ci=f.ci_target, max_time_s=f.max_time,
        min_reps=min(3, f.max_reps))
    return BenchConfig(models=f.models, backends=choose_backends(f.backend, f.models),
                       tests=tests, loads=_loads(f), reps=reps, model_name=f.model_name,
                       delay_s=f.delay, sustained_s=f.sustained, seed=f.seed)

FORMATS_HELP = ("table", "md", "csv", "json", "jsonl")
