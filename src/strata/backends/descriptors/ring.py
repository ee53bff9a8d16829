"""ring: a GGUF run across a `strata ring serve` ring (the daemon at STRATA_RING, default
127.0.0.1:7473), the leader's plan deciding which member holds which layers."""

from __future__ import annotations

from strata.backends.base import BackendDescriptor, LoadConfig

# The members' devices are theirs (serve --device), not a LoadConfig field; "ring" names no
# roofline of this host, so no η is computed against a machine that ran only part of the model.
DEVICE = "ring"


def _device(_config: LoadConfig) -> str:
    return DEVICE


def _preflight() -> None:
    from strata.backends.ring import preflight  # numpy and the ring's control: lazily

    preflight()


# No fit rules (`strata ring plan` is the ring's fit), no scorer (the ring returns tokens).
# auto=False: a ring is a set of running daemons, never something `--backend auto` assumes.
DESCRIPTOR = BackendDescriptor(
    name="ring", factory="strata.backends.ring:RingBackend", accepts=("gguf",),
    help="across a strata ring (the daemon at $STRATA_RING, default 127.0.0.1:7473)",
    order=40, options=("kv_type", "kv_type_v"), device=_device, auto=False,
    # the members' hardware runs it: this host's roofline explains nothing of a ring
    roofline=False, preflight=_preflight)
