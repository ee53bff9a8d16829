"""Why that fast: bytes per token, roofline ceilings, efficiency η and the bound
(docs/architecture.md §5).

decode ceiling (t/s) = measured bandwidth / bytes read per decoded token
prefill ceiling (t/s) = measured FLOP/s / FLOPs per prompt token
η = achieved / ceiling. η < 0.4 is suspect (partial offload where an accelerator's roofline
judges the test, a slow backend path, too few threads, throttling) — unless other processes
were using the CPUs meanwhile (a busy host, issue 10 §1): then the verdict names the busy
host first; η > 1.05 means our model of the bytes is wrong, or the stored peak is low (the
runner re-measures it) — reported, never hidden. A decode whose bytes per token fit in the
CPU's last-level cache gets one statement instead (its DRAM ceiling does not apply), never a
"fault" verdict beside a "DRAM does not bound it" one (issue 17).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from strata.bench.scenario import BenchTest
from strata.hardware.telemetry.hostload import HostLoad
from strata.measure.roofline import DeviceRoofline
from strata.models.spec import ModelSpec

ETA_LOW, ETA_HIGH = 0.4, 1.05

# KV cache bytes per element by cache type (GGUF block sizes: q8_0 34 B / 32, q4_0 18 B / 32).
KV_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32,
            "float32": 4.0, "float16": 2.0, "bfloat16": 2.0}

# Which measured matmul figure bounds prefill for a given weight storage type. Quantised
# GGUF weights are multiplied with int8 dot products where the CPU has them, else in fp32.
# The arithmetic a backend runs on weights stored so: llama.cpp and the lab multiply every
# quantised type by integer dot products against q8 activations (ggml's vec_dot_*_q8_*), so
# their prompt roof is the int8 peak, not torch's fp32 matmul.
QUANTISED = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
             "Q8_K", "IQ4_NL", "IQ4_XS", "MXFP4")
COMPUTE_DTYPE = {"F32": "fp32", "float32": "fp32", "F16": "fp16", "float16": "fp16",
                 "BF16": "bf16", "bfloat16": "bf16", **dict.fromkeys(QUANTISED, "int8")}
PREFILL_PASS = 512  # tokens a prefill streams the weights once for (llama.cpp's n_ubatch)


@dataclass
class Explanation:
    bytes_per_token: float  # weights streamed + KV read, per decoded token
    weight_bytes_per_token: float
    kv_bytes_per_token: float
    flops_per_prompt_token: float
    flops_per_decode_token: float
    device: str
    bandwidth_gbs: float | None
    compute_dtype: str | None
    compute_gflops: float | None
    decode_ceiling_tps: float | None = None  # the lower of its memory and compute roofs
    prefill_ceiling_tps: float | None = None  # likewise
    decode_bound: str | None = None  # which roof gave decode_ceiling_tps
    prefill_bound: str | None = None
    decode_eta: float | None = None
    prefill_eta: float | None = None
    bound: str | None = None  # "memory" or "compute" for the test's main phase
    host_busy: str | None = None  # the busy-host verdict, when other processes were busy
    host_busy_share: float | None = None  # other processes' share of all CPUs meanwhile
    cache_resident: bool = False  # bytes per token fit in the CPU's last-level cache
    verdict: list[str] = field(default_factory=list)
    basis: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def runtime_weight_bytes(spec: ModelSpec, runtime_dtype: str | None) -> float:
    """Streamed weight bytes as the backend holds them: a torch backend that loaded f16
    weights as bf16/f32 reads runtime_dtype bytes per parameter, not the file's."""
    if runtime_dtype is None:
        return float(spec.streamed_weight_bytes())
    return spec.active_params() * KV_BYTES[runtime_dtype]


def explain(spec: ModelSpec, test: BenchTest, roof: DeviceRoofline, kv_type: str,
            runtime_dtype: str | None, achieved: dict[str, float | None],
            cache_bytes: int | None = None, host_load: HostLoad | None = None) -> Explanation:
    """Ceilings and η for one test. `achieved` holds the measured mean t/s figures;
    `host_load` is what other processes used meanwhile (HostLoadMonitor)."""
    kv_per_elem = KV_BYTES.get(kv_type, 2.0)
    mid_ctx = test.depth + test.n_prompt + test.n_gen / 2  # average context while decoding
    weights = runtime_weight_bytes(spec, runtime_dtype)
    kv = spec.kv_bytes(int(mid_ctx), kv_per_elem)
    dtype = COMPUTE_DTYPE.get(runtime_dtype or spec.main_dtype())
    gflops = roof.peak_gflops(dtype) if dtype else None
    if gflops is None and dtype != "fp32" and roof.peak_gflops("fp32"):
        dtype, gflops = "fp32", roof.peak_gflops("fp32")
    ex = Explanation(bytes_per_token=weights + kv, weight_bytes_per_token=weights,
                     kv_bytes_per_token=kv,
                     flops_per_prompt_token=_prompt_flops(spec, test),
                     flops_per_decode_token=spec.flops_per_token(int(mid_ctx)),
                     device=roof.device, bandwidth_gbs=roof.peak_bandwidth_gbs(),
                     compute_dtype=dtype, compute_gflops=gflops)
    _ceilings(ex, test)
    _etas(ex, achieved)
    ex.bound = ex.prefill_bound if test.kind == "pp" else ex.decode_bound
    if host_load is not None and host_load.busy:
        ex.host_busy, ex.host_busy_share = host_load.verdict, host_load.busy_share
    ex.cache_resident = bool(cache_bytes and ex.bytes_per_token < cache_bytes
                             and roof.device == "cpu")
    ex.verdict = _verdicts(ex, cache_bytes if ex.cache_resident else None)
    if spec.is_moe:  # said with every result: its bytes/token are not the file's size
        ex.verdict.append("mixture of experts" + _experts_text(spec))
    ex.basis = [f"bytes/token from {len(spec.tensors)} tensors' stored types"
                + (f" at runtime dtype {runtime_dtype}" if runtime_dtype else "")
                + f" + KV {kv_type} at context {int(mid_ctx)}"
                + (f"; {_experts_text(spec)[2:]}" if spec.is_moe else ""),
                f"bandwidth: best STREAM rate of {roof.device}",
                f"FLOP/s: measured {dtype} matmul" if dtype else "FLOP/s: not measured"]
    return ex


def _experts_text(spec: ModelSpec) -> str:
    """What a mixture of experts reads per token: the shared weights (router included) and
    only the experts a token is routed to; prefill FLOPs count those experts alone too."""
    if not spec.is_moe:
        return ""
    shared = spec.active_weight_bytes() - spec.active_expert_bytes()
    return (f": active experts {spec.n_experts_used} of {spec.n_experts} per layer "
            f"({_size(spec.active_expert_bytes())} of {_size(spec.expert_bytes())} of experts, "
            f"+ {_size(shared)} of shared weights and routers per token; FLOPs from "
            f"{spec.active_params():,} active of {spec.params():,} params)")


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 2**10:,.1f} KiB"


def _prompt_flops(spec: ModelSpec, test: BenchTest) -> float:
    """FLOPs per prompt token at the prompt's middle context; logits for the last token only
    (what llama-bench and both in-process backends compute), so the head is amortised."""
    n = max(test.n_prompt, 1)
    return spec.flops_per_token(test.depth + test.n_prompt // 2, logits_share=1 / n)


def _ceilings(ex: Explanation, test: BenchTest) -> None:
    """Each phase's ceiling is the lower of its two roofs, and its bound names that roof:
    decode reads every weight per token (memory: bandwidth ÷ bytes per token; compute:
    FLOP/s ÷ FLOPs per token); prefill streams the weights and the cache once per pass of
    up to PREFILL_PASS tokens (memory: a tiled attention reads the cache once for all the
    pass's queries), and does its FLOPs per prompt token (compute). A ceiling with one roof
    unmeasured is the other's."""
    bw = ex.bandwidth_gbs * 1e9 if ex.bandwidth_gbs else None
    flops = ex.compute_gflops * 1e9 if ex.compute_gflops else None
    per_pass = max(1, min(test.n_prompt, PREFILL_PASS))
    prefill_bytes = ex.bytes_per_token / per_pass
    ex.decode_ceiling_tps, ex.decode_bound = _lower(
        bw / ex.bytes_per_token if bw else None,
        flops / ex.flops_per_decode_token if flops and ex.flops_per_decode_token else None)
    ex.prefill_ceiling_tps, ex.prefill_bound = _lower(
        bw / prefill_bytes if bw and prefill_bytes else None,
        flops / ex.flops_per_prompt_token if flops and ex.flops_per_prompt_token else None)


def _lower(memory: float | None, compute: float | None) -> tuple[float | None, str | None]:
    roofs = [(v, name) for v, name in ((memory, "memory"), (compute, "compute")) if v]
    if not roofs:
        return None, None
    value, name = min(roofs)
    return value, name if len(roofs) == 2 else None


def _etas(ex: Explanation, achieved: dict[str, float | None]) -> None:
    dec, pre = achieved.get("decode_tps"), achieved.get("prefill_tps")
    if dec and ex.decode_ceiling_tps:
        ex.decode_eta = dec / ex.decode_ceiling_tps
    if pre and ex.prefill_ceiling_tps:
        ex.prefill_eta = pre / ex.prefill_ceiling_tps


def eta_text(eta: float) -> str:
    """η as printed everywhere: two decimals, or two significant figures below 0.1 (a
    0.004 is not "0.00", and "below about 0.00" says nothing)."""
    return f"{eta:.2g}" if 0 < abs(eta) < 0.1 else f"{eta:.2f}"


# A test competing with other processes for share s of all CPUs keeps roughly 1 - s of them:
# it can run up to about 1 / (1 - s) times slower (capped: a share near 1 is a guess anyway).
MAX_BUSY_SLOWDOWN = 10.0


def busy_slowdown(share: float) -> float:
    return min(1.0 / max(1.0 - share, 1e-9), MAX_BUSY_SLOWDOWN)


def _suspects(device: str) -> str:
    """What can make a test far slower than its roofline. Partial offload only where the
    test was judged against an accelerator's roofline: on the CPU nothing was offloaded."""
    if device == "cpu":
        return "a slow backend path for this dtype, too few threads, or throttling"
    return "partial offload, a slow backend path for this dtype, or throttling"


def _busy_low(phase: str, eta: float, busy: str, share: float, device: str = "cpu") -> str:
    """A low η on a busy host: name the host first; say whether it can explain all of it."""
    quiet = eta * busy_slowdown(share)
    if quiet >= ETA_LOW:
        return (f"{phase} η {eta_text(eta)} < {ETA_LOW}: {busy} — that explains a low η (a "
                f"quiet host would allow up to about {eta_text(quiet)}); re-run on a quiet host "
                "before "
                f"suspecting {_suspects(device)}")
    return (f"{phase} η {eta_text(eta)} < {ETA_LOW}: {busy}, but even a quiet host would "
            f"leave η below about {eta_text(quiet)}: also suspect {_suspects(device)} (re-run "
            "on a quiet host to tell them apart)")


def _cache_verdict(ex: Explanation, cache_bytes: int) -> str:
    """One statement for a decode whose bytes fit in the last-level cache: its ceiling assumes
    DRAM bandwidth, which does not bound it, so η says nothing about faults here."""
    fits = (f"the {ex.bytes_per_token / 2**20:.1f} MiB read per token fit in the "
            f"{cache_bytes / 2**20:.0f} MiB last-level cache")
    eta = ex.decode_eta or 0.0
    if eta > ETA_HIGH:
        why = "served from cache, it beats the DRAM ceiling"
    elif eta < ETA_LOW:
        why = "per-token overhead, not DRAM bandwidth, bounds it"
    else:
        why = "DRAM bandwidth does not bound it, per-token overhead or cache bandwidth does"
    return (f"decode η {eta_text(eta)} is measured against DRAM bandwidth, but {fits}: {why}; "
            "a model larger than the cache gives a meaningful η")


def _verdicts(ex: Explanation, cache_bytes: int | None = None) -> list[str]:
    out = []
    if cache_bytes and ex.decode_eta is not None:  # a pp test has no decode to judge
        out.append(_cache_verdict(ex, cache_bytes))
    for phase, eta in (("decode", ex.decode_eta), ("prefill", ex.prefill_eta)):
        if eta is None or (phase == "decode" and cache_bytes):
            continue
        if eta > ETA_HIGH:
            out.append(f"{phase} η {eta_text(eta)} > {ETA_HIGH}: faster than the roofline "
                       "allows — the "
                       "byte/FLOP model or the measured peak is wrong here (e.g. weights "
                       "served from cache, or a peak measured under load)")
        elif eta < ETA_LOW and ex.host_busy:
            out.append(_busy_low(phase, eta, ex.host_busy, ex.host_busy_share or 0.0,
                                 ex.device))
        elif eta < ETA_LOW:
            out.append(f"{phase} η {eta_text(eta)} < {ETA_LOW}: far below the roofline — "
                       "suspect "
                       f"{_suspects(ex.device)}")
    return out
