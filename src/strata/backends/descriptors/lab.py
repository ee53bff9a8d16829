"""lab: GGUF models on the kernel lab's own verified kernels (strata.lab), weights as stored."""

from __future__ import annotations

from strata.backends.base import BackendDescriptor, LoadConfig, Scoring


def _device(config: LoadConfig) -> str:
    return config.device if config.device != "cuda" else "cuda:0"


# quality: the GGUF as stored, on the CPU; the context sized to --ctx
SCORING = Scoring(config=lambda ctx: LoadConfig(n_ctx=ctx, device="cpu"),
                  form=lambda model: model)

DESCRIPTOR = BackendDescriptor(
    name="lab", factory="strata.backends.lab:LabBackend", accepts=("gguf",),
    help="GGUF on the kernel lab's verified kernels, weights as stored", order=30,
    options=("threads", "device", "n_ctx"), device=_device, scoring=SCORING, auto=False)
