"""`strata probe`: assemble the HostProfile — CPU, GPUs, software, support verdicts.

Each part is probed independently; a part that fails is recorded in `unknown` with its
reason and the probe goes on (issue 2: the probe always completes).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from strata.hardware.cpu import probe_cpu
from strata.hardware.gpu import probe_gpus
from strata.hardware.profile import GpuInfo, HostProfile, SmokeResult, SoftwareStack
from strata.hardware.software import probe_software

Progress = Callable[[str], None]

# dtypes each torch device kind claims; the smoke test checks every one for real.
CLAIMED_DTYPES: dict[str, list[str]] = {
    "cpu": ["float32", "bfloat16", "float16"],
    "cuda": ["float32", "float16", "bfloat16"],
    "rocm": ["float32", "float16", "bfloat16"],
    "mps": ["float32", "float16", "bfloat16"],
    "xpu": ["float32", "float16", "bfloat16"],
}


def claimed_dtypes(gpu: GpuInfo) -> list[str]:
    dtypes = list(CLAIMED_DTYPES.get(gpu.backend, ["float32"]))
    # bf16 arrived with Ampere (sm_80); older NVIDIA parts emulate or refuse it.
    if gpu.vendor == "nvidia" and gpu.arch and int(gpu.arch.removeprefix("sm_")[:-1] or 0) < 8:
        dtypes.remove("bfloat16")
    return dtypes


def probe_host(smoke: bool = True, smoke_timeout_s: float = 90.0,
               progress: Progress | None = None) -> HostProfile:
    say = progress or (lambda _msg: None)
    say("cpu")
    cpu = probe_cpu()
    say("gpus")
    gpus, unknown = probe_gpus()
    say("software stack")
    software = probe_software()
    profile = HostProfile(hostname=socket.gethostname(), cpu=cpu, gpus=gpus, software=software,
                          unknown=unknown)
    profile.verdicts = support_verdicts(profile, smoke, smoke_timeout_s, say)
    return profile


def support_verdicts(profile: HostProfile, smoke: bool, timeout_s: float, say: Progress) -> list:
    from strata.hardware.smoke import run_smoke
    from strata.hardware.support import cpu_verdict, verdict_for

    verdicts = []
    if smoke:
        say("smoke test cpu")
    cpu_smoke = run_smoke("cpu", CLAIMED_DTYPES["cpu"], timeout_s) if smoke else None
    verdicts.append(cpu_verdict(cpu_smoke, profile.software))
    for gpu in profile.gpus:
        result = _gpu_smoke(gpu, profile.software, smoke, timeout_s, say)
        verdicts.append(verdict_for(gpu, profile.software, result))
    return verdicts


def _gpu_smoke(gpu: GpuInfo, sw: SoftwareStack, smoke: bool, timeout_s: float,
               say: Progress) -> SmokeResult | None:
    from strata.hardware.smoke import run_smoke
    from strata.hardware.support import smoke_device_for

    if not smoke or sw.torch is None:
        return None
    say(f"smoke test {gpu.key}")
    return run_smoke(smoke_device_for(gpu), claimed_dtypes(gpu), timeout_s)
