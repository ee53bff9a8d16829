"""Any OpenAI-compatible HTTP server (llama-server, vLLM, Ollama, ...): an endpoint URL."""

from __future__ import annotations

from strata.backends.base import BackendDescriptor, LoadConfig


def _device(config: LoadConfig) -> str:
    # The server's hardware is not visible from here, and an endpoint has no weight types to
    # explain against; this keeps the rule strata applied before descriptors existed.
    return "cuda:0" if config.n_gpu_layers > 0 else "cpu"


# No fit rules (the weights are the server's) and no scorer (no per-position logits).
DESCRIPTOR = BackendDescriptor(
    name="openai", factory="strata.backends.openai:OpenAIBackend", accepts=("endpoint",),
    help="an OpenAI-compatible server's URL", order=30, options=(),
    device=_device)
