"""Can the usual software drive a catalogue GPU? The probe's support rules, fed stacks.

Each catalogue GPU is judged under the PyTorch wheels strata knows (NVIDIA: support_facts'
cuda_wheels; others: rules/stacks.json) with a driver new enough for each, so the answer
names the stack that can drive it and the one that cannot (RDNA4 + ROCm 6.2). llama.cpp's
backends for the vendor are said beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from strata.hardware.catalogue import CatalogueDevice
from strata.hardware.profile import GpuInfo, SoftwareStack
from strata.hardware.support import check_rules
from strata.hardware.vendors.rules import load_facts, version_tuple
from strata.whatif.device import RULES_FILE, TORCH_BACKEND

STACKS_FILE = RULES_FILE.parent / "stacks.json"


@lru_cache(maxsize=1)
def _stacks() -> dict[str, Any]:
    return json.loads(STACKS_FILE.read_text(encoding="utf-8"))


def _nvidia_stacks() -> list[SoftwareStack]:
    facts = load_facts()
    drivers = facts["cuda_toolkit_driver"]["min_driver_linux"]
    out = []
    for e in facts["cuda_wheels"]["entries"]:
        if not e.get("archs"):
            continue  # an arch list nobody read: no verdict can rest on it
        cuda = e["cuda"]
        out.append(SoftwareStack("", "Linux", "", torch=f"{e['torch']}+{e['variant']}",
                                 torch_build=f"cuda {cuda}", torch_arch_list=list(e["archs"]),
                                 torch_cuda_runtime=cuda, nvidia_driver=drivers.get(cuda),
                                 cuda_driver_api=cuda))
    return out


def stacks_for(vendor: str) -> list[SoftwareStack]:
    if vendor == "nvidia":
        return _nvidia_stacks()
    return [SoftwareStack("", "macOS" if vendor == "apple" else "Linux", "", torch=s["torch"],
                          torch_build=s["torch_build"], torch_arch_list=list(s["torch_arch_list"]))
            for s in _stacks()["torch"].get(vendor, [])]


@dataclass
class Support:
    """The verdicts of one device: which stacks drive it, which cannot, and why."""

    works: list[str] = field(default_factory=list)  # "torch 2.8+cu128"
    fails: list[tuple[str, str]] = field(default_factory=list)  # (stack, first reason)
    llama_cpp: str = ""
    remedy: str | None = None

    @property
    def text(self) -> str:
        parts = [f"llama.cpp: {self.llama_cpp}"] if self.llama_cpp else []
        if self.works:
            parts.append(f"PyTorch: {self.works[0]} and later")
        if self.fails:
            stack, why = self.fails[-1]
            parts.append(f"not {stack}: {why}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"llama_cpp": self.llama_cpp, "torch_works": self.works,
                "torch_fails": [{"stack": s, "reason": r} for s, r in self.fails],
                "remedy": self.remedy}


def support(dev: CatalogueDevice) -> Support:
    out = Support(llama_cpp=_stacks()["llama_cpp"].get(
        "cpu" if dev.kind == "cpu" else dev.vendor, ""))
    if dev.kind == "cpu":
        return out
    gpu = GpuInfo(0, dev.vendor, dev.name, TORCH_BACKEND.get(dev.vendor, "cuda"), dev.arch,
                  dev.memory_bytes, source="catalogue")
    stacks = sorted(stacks_for(dev.vendor), key=lambda s: version_tuple(s.torch))
    for sw in stacks:
        r = check_rules(gpu, sw)
        label = f"torch {sw.torch}"
        if r.status == "unsupported":
            out.fails.append((label, (r.reasons or r.fails or ["unsupported"])[0]))
            out.remedy = out.remedy or r.remedy
        elif r.status in ("supported", "partial"):
            out.works.append(label)
    return out
