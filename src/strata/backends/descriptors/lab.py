"""lab: GGUF models on the kernel lab's own verified kernels (strata.lab), weights as stored."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strata.backends.base import BackendDescriptor, LoadConfig, Scoring
from strata.models.source import ResolvedModel

if TYPE_CHECKING:
    from strata.fit.backends import BackendRules, Runtime
    from strata.fit.memory import DeviceRules, Shape, Share
    from strata.fit.weights import QuantSpec
    from strata.hardware.profile import HostProfile
    from strata.models.spec import ModelSpec

KV_TYPE = "f16"  # the lab's default K/V cache, llama.cpp's (-ctk/-ctv f32: float32)
# what the lab's attention ops read (attention_cached[_f16|_q8_0] ...), and how fit says it
KV_TYPES = {"f16": "float16", "f32": "float32",
            "q8_0": "q8_0 blocks (34 bytes per 32 values)"}
UBATCH = 512  # strata.lab.model.UBATCH (that module imports torch): tokens per prefill chunk
F32 = 4


def _device(config: LoadConfig) -> str:
    return config.device if config.device != "cuda" else "cuda:0"


# -- fit rules --------------------------------------------------------------------------------
# Weights: the GGUF's bytes as stored (read into memory once; no dequantised copy), as for
# llama.cpp. KV: 2·layers·kv_heads·head_dim·ctx elements of -ctk's type (f16, or f32). Neither
# llama.cpp's nor torch's buffer rule describes the lab: llama.cpp reserves a whole graph (an
# f16 score copy, all-logits worst case) and torch runs the whole prompt at once with a ctx²
# mask, while the lab prefills in 512-token chunks, one layer's f32 intermediates at a time, and
# asks logits of one token. So buffers get the lab's own rule, the same on both device kinds;
# overheads are the torch backend's (the same torch runtime: 100 MiB on the CPU, a 512 MiB
# context prior per GPU).


def _attention_floats(spec: ModelSpec, ctx: int) -> int:
    """f32 values per token live at a layer's attention output projection: the residual, its
    norm and the projection (hidden each), q after rope, its [H,T,D] copy, the output and its
    row copy (4 · n_heads·head_dim), k and v (2 · n_kv_heads·head_dim), and the scores torch's
    SDPA may build when it serves attention_cached (n_heads · ctx; a lab kernel needs none)."""
    q, kv = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    return 3 * spec.hidden + 4 * q + 2 * kv + spec.n_heads * ctx


def _mlp_floats(spec: ModelSpec) -> int:
    """... and at its MLP: residual, norm, down output (hidden each), gate, up, silu_mul."""
    return 3 * spec.hidden + 3 * spec.ffn


def lab_buffers(spec: ModelSpec, shape: Shape, share: Share) -> int:
    if not share.blocks:  # a GPU run's host side: each tensor is staged in RAM on its way
        return max((t.nbytes for t in spec.tensors), default=0)
    tokens = min(UBATCH, shape.ctx)  # one sequence, prefilled in chunks
    per_token = F32 * max(_attention_floats(spec, shape.ctx), _mlp_floats(spec)) + shape.ctx
    rope = F32 * shape.ctx * spec.head_dim  # cos and sin tables [ctx, head_dim / 2]
    return tokens * per_token + rope + F32 * spec.vocab  # + one token's logits


_BUFFERS_TEXT = (
    "lab buffers = min(512, ctx) x [4·max(3·hidden + 4·n_heads·head_dim + "
    "2·n_kv_heads·head_dim + n_heads·ctx, 3·hidden + 3·ffn) + ctx] B + 4·ctx·head_dim B (rope "
    "tables) + 4·vocab B (one token's logits): one 512-token prefill chunk, one layer's f32 "
    "intermediates at a time, with the f32 scores and bool mask torch makes when it serves "
    "attention_cached; a rule, not checked against real allocations",
    "lab KV cache = 2·layers·kv_heads·head_dim·ctx x 2 B (f16; --kv-type f32: 4 B, q8_0: "
    "34/32 B; ctx counted in steps of 256 as for llama.cpp: at most 255 positions over)")


def _rules() -> tuple[DeviceRules, DeviceRules]:
    from strata.fit.memory import (
        GPU_RUNTIME_PRIOR,
        TORCH_CPU_OVERHEAD,
        DeviceRules,
        MiB,
        gpu_runtime_overhead,
        torch_overhead,
    )

    cpu = DeviceRules(lab_buffers, torch_overhead, (
        *_BUFFERS_TEXT,
        f"lab CPU overhead = {TORCH_CPU_OVERHEAD // MiB} MiB: the torch backend's measured "
        "figure (the same torch runtime), a prior for lab"), measured=False)
    gpu = DeviceRules(lab_buffers, gpu_runtime_overhead, (
        *_BUFFERS_TEXT,
        f"GPU runtime overhead = {GPU_RUNTIME_PRIOR // MiB} MiB per GPU (CUDA/ROCm context): "
        "a prior, not measured on this host",
        "lab on a GPU also needs RAM for its largest tensor, staged on the host while the "
        "weights are copied over"), measured=False)
    return cpu, gpu


def _runtime(model: ResolvedModel, _host: HostProfile, _kind: str,
             kv_type: str | None) -> Runtime:
    from strata.errors import InputError
    from strata.fit.backends import Runtime

    if "gguf" not in model.artefacts:
        raise InputError(f"MODEL {model.ref}: -B lab runs GGUF files (weights as stored); "
                         f"this {model.kind} model has none: convert it "
                         "(convert_hf_to_gguf.py) or use --backend torch")
    spec = model.spec_for("gguf")
    assert spec is not None
    kv = kv_type or KV_TYPE
    if kv == "q8_0" and spec.head_dim % 32:
        raise InputError(f"--kv-type q8_0: blocks of 32 values, but this model's heads have "
                         f"{spec.head_dim}; use --kv-type f16")
    return Runtime(spec, kv, None, ["lab holds the weights as stored in the GGUF and K/V in "
                                    f"{KV_TYPES.get(kv, kv)}"])


def _quant(model: ResolvedModel, rt: Runtime, quant: str) -> QuantSpec:
    from strata.fit.weights import at_quant

    return at_quant(model, rt.spec, quant)


def _fit() -> BackendRules:
    from strata.fit.backends import BackendRules
    from strata.lab.plan import LINEAR_OPS, fit_sections
    from strata.models.synthetic import QUANTS

    # the quantisations strata can size whose matrices a lab op reads: a mix's default type,
    # its fallback for odd widths and the Q6_K/Q8_0 its rules give heads and attn_v
    def reads(q: str) -> bool:
        types = {QUANTS[q].matrix, QUANTS[q].fallback} | \
            ({"Q6_K", "Q8_0"} if QUANTS[q].mix else set())
        return types <= set(LINEAR_OPS)

    quants = tuple(q for q in QUANTS if reads(q))
    cpu, gpu = _rules()
    return BackendRules("lab", tuple(KV_TYPES), quants, False, {"cpu": cpu, "gpu": gpu}, _runtime,
                        _quant, sections=fit_sections, window_cells=_window_cells)


def _window_cells(spec: ModelSpec, shape: Shape, _swa_full: bool) -> int | None:
    """The lab's windowed cache (strata.engine.executor.Cache): window - 1 + one chunk of
    UBATCH positions, never more than the cache's capacity (the context in whole steps of
    256 positions, as -B lab allocates it: n_kv)."""
    if not spec.sliding_window:
        return None
    return min(shape.n_kv, spec.sliding_window - 1 + UBATCH)


# quality: the GGUF as stored, on the CPU; the context sized to --ctx
SCORING = Scoring(config=lambda ctx: LoadConfig(n_ctx=ctx, device="cpu"),
                  form=lambda model: model)

def _check(model: ResolvedModel) -> str | None:
    """From the GGUF's metadata: an architecture strata declares, and a lab op for every
    matrix's storage type (BF16 is widened to F32 as it is read)."""
    from strata.lab.plan import LINEAR_OPS
    from strata.models import arch

    spec = model.spec_for("gguf") or model.spec
    if spec is None:
        return None
    if arch.find(spec.arch) is None:
        return (f"-B lab runs the {', '.join(arch.names())} architectures, not {spec.arch} "
                "(--backend llamacpp runs it)")
    kinds = sorted({t.dtype for t in spec.tensors if len(t.shape) >= 2
                    and not t.name.endswith(".bias")} - set(LINEAR_OPS) - {"BF16"})
    if kinds:
        return (f"no lab op multiplies {', '.join(kinds)} weights yet (--backend llamacpp "
                "runs it)")
    return None


DESCRIPTOR = BackendDescriptor(
    name="lab", factory="strata.backends.lab:LabBackend", accepts=("gguf",),
    help="GGUF on the kernel lab's verified kernels, weights as stored", order=30,
    options=("threads", "device", "n_ctx", "kv_type", "kv_type_v"), device=_device, fit=_fit,
    scoring=SCORING, auto=False, check=_check)
