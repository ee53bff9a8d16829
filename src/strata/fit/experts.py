"""llama.cpp's expert offload for a mixture-of-experts model that does not fit a GPU whole.

Every layer goes to the GPU except the routed experts' tensors, which stay in RAM:
`-ngl 99 -ot exps=CPU` (`--override-tensor`; newer builds spell it `--cpu-moe`, or
`--n-cpu-moe N` for the experts of the first N layers only). The GPU then holds the
attention, norms, routers, shared experts and output layer (the shared weights) and the
whole KV cache; the CPU holds the experts and multiplies the few a token is routed to.

Decode, per token and layer, runs the attention on the GPU and then the routed experts on
the CPU, one after the other, so the times add:
  t = (shared weights + KV) / GPU bandwidth + active experts' bytes / CPU bandwidth
ceiling = 1 / t, prediction = ceiling x η (the GPU's past decode η, else the prior).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strata.bench.explain import KV_BYTES
from strata.bench.scenario import BenchTest
from strata.fit.memory import (
    F32,
    LayerBytes,
    Memory,
    Share,
    ffn_per_token,
    kv_bytes,
    llamacpp_cpu_resident,
)
from strata.fit.predict import EtaHistory, Prediction
from strata.fit.verdict import Budget, Case, _need, _within
from strata.measure.roofline import DeviceRoofline
from strata.models.spec import ModelSpec

FLAGS = "-ngl 99 -ot exps=CPU"
NEWER_FLAGS = "--cpu-moe"
TEXT = "attention and shared weights on the GPU, experts on the CPU"

RULE = ("expert offload (-ngl 99 -ot exps=CPU): GPU = every layer's non-expert weights + "
        "output layer + all of the KV cache + the full-offload compute buffer + one layer's "
        "expert tensors (llama.cpp copies a host weight to the GPU to multiply a large prompt "
        "batch there: a prior, not measured); RAM = experts + token embedding + staging, "
        "the experts' FFN intermediates for one ubatch and logits")


@dataclass
class ExpertOffload:
    """The expert-offload placement of one GPU: memory on each side and whether it fits."""

    device: Memory  # on the GPU
    host: Memory  # in RAM
    fits: bool
    reason: str
    predictions: list[Prediction]
    basis: list[str] = field(default_factory=list)  # how each prediction's ceiling adds up

    flags = FLAGS

    def to_dict(self) -> dict[str, Any]:
        return {"flags": self.flags, "fits": self.fits, "reason": self.reason,
                "device": self.device.to_dict(), "host": self.host.to_dict(),
                "predictions": [p.to_dict() for p in self.predictions], "basis": self.basis}


def _largest_layer_experts(spec: ModelSpec) -> int:
    per_layer: dict[str, int] = {}
    for t in spec.expert_tensors():
        layer = t.name.split(".")[1]
        per_layer[layer] = per_layer.get(layer, 0) + t.nbytes
    return max(per_layer.values(), default=0)


def offload_memory(case: Case) -> tuple[Memory, Memory]:
    """(GPU, RAM) memory with every layer on the GPU and the routed experts in RAM."""
    spec, shape, rules = case.spec, case.shape, case.rules
    layers = LayerBytes.of(spec)
    experts = spec.expert_bytes()
    gpu_share = Share(sum(layers.blocks) - experts + layers.output, spec.n_layers, True)
    gpu_rules, cpu_rules = rules.devices["gpu"], rules.devices["cpu"]
    gpu = Memory(weights=gpu_share.weights, kv=kv_bytes(spec, shape, spec.n_layers),
                 buffers=gpu_rules.buffers(spec, shape, gpu_share)
                 + _largest_layer_experts(spec),
                 overhead=gpu_rules.overhead(spec))
    host_share = Share(layers.input + experts, 0, False)
    staging = llamacpp_cpu_resident(spec, shape, host_share)  # embedded inputs + logits
    host = Memory(weights=host_share.weights, kv=0,
                  buffers=staging + shape.n_ub * (ffn_per_token(spec) + F32 * spec.hidden),
                  overhead=cpu_rules.overhead(spec))
    return gpu, host


def expert_offload(case: Case, gpu: Budget, ram: Budget) -> ExpertOffload | None:
    """The placement for a MoE model on a GPU that cannot hold it whole (None: a dense
    model, or a backend without llama.cpp's per-tensor placement)."""
    if not (case.spec.is_moe and case.rules.layer_split):
        return None
    device, host = offload_memory(case)
    fits = _within(device, gpu) and _within(host, ram)
    reason = (_need(device, gpu, "with experts on the CPU, the GPU side") if gpu.available
              is not None else "the probe could not read this GPU's memory")
    if _within(device, gpu) and not _within(host, ram):
        reason = _need(host, ram, "with experts on the CPU, RAM")
    return ExpertOffload(device, host, fits, reason, [])


@dataclass(frozen=True)
class OffloadTime:
    """Seconds per decoded token of the expert-offload placement, and its parts."""

    gpu_bytes: float  # shared weights + KV, read by the GPU
    cpu_bytes: float  # the routed experts a token uses, read by the CPU
    gpu_gbs: float
    cpu_gbs: float

    @property
    def seconds(self) -> float:
        return self.gpu_bytes / (self.gpu_gbs * 1e9) + self.cpu_bytes / (self.cpu_gbs * 1e9)

    @property
    def ceiling_tps(self) -> float:
        return 1.0 / self.seconds

    def text(self) -> str:
        mb = 2**20
        return (f"ceiling = 1 / ({self.gpu_bytes / mb:,.1f} MiB shared weights + KV at "
                f"{self.gpu_gbs:,.0f} GB/s on the GPU + {self.cpu_bytes / mb:,.1f} MiB of "
                f"active experts at {self.cpu_gbs:,.1f} GB/s on the CPU) = "
                f"{self.ceiling_tps:,.1f} t/s")


def offload_time(spec: ModelSpec, test: BenchTest, kv_type: str, gpu_gbs: float,
                 cpu_gbs: float) -> OffloadTime:
    """Bytes per decoded token on each side (KV at the test's mid context, as explain)."""
    mid_ctx = test.depth + test.n_prompt + test.n_gen / 2
    experts = spec.active_expert_bytes()
    shared = spec.active_weight_bytes() - experts
    kv = spec.kv_bytes(int(mid_ctx), KV_BYTES.get(kv_type, 2.0))
    return OffloadTime(shared + kv, experts, gpu_gbs, cpu_gbs)


def predict_offload(offload: ExpertOffload, spec: ModelSpec, tests: list[BenchTest],
                    gpu: DeviceRoofline, cpu: DeviceRoofline, kv_type: str,
                    history: EtaHistory) -> bool:
    """Decode predictions for the expert-offload placement, into `offload`; False where the
    roofline lacks either bandwidth."""
    gpu_gbs, cpu_gbs = gpu.peak_bandwidth_gbs(), cpu.peak_bandwidth_gbs()
    if not (gpu_gbs and cpu_gbs):
        return False
    eta = history.eta(gpu.device, "decode")
    for test in tests:
        if test.kind != "tg":
            continue
        t = offload_time(spec, test, kv_type, gpu_gbs, cpu_gbs)
        c = t.ceiling_tps
        offload.predictions.append(Prediction(gpu.device, test.name, "decode", c, eta,
                                              c * eta.value, c * eta.low, c * eta.high))
        offload.basis.append(f"{test.name}: {t.text()}")
    return True

