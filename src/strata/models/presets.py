"""Architecture presets: sourced shape values (data/presets.json), not code.

A preset is all a synthetic model needs: the shapes of a published model, so strata can
write random weights with exactly its tensor sizes (speed does not depend on the values).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

from strata.errors import InputError

PRESETS_FILE = "presets.json"
MOE_FIELDS = ("n_experts", "n_experts_used", "expert_ffn")
# fields a preset without them leaves out of its values (and so out of its content key)
OPTIONAL_FIELDS = ("sliding_window", "rope_scaling")


@dataclass(frozen=True)
class Preset:
    name: str
    arch: str  # llama.cpp architecture name: "llama", "qwen2", "qwen3moe"
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    ctx_max: int
    tied_embeddings: bool
    rope_theta: float
    norm_eps: float
    qkv_bias: bool
    source: str  # where the values come from (a published config.json)
    # Mixture of experts (0 = dense): routed experts per layer (num_experts /
    # num_local_experts), experts per token (num_experts_per_tok) and one expert's FFN width
    # (moe_intermediate_size; Mixtral's experts are intermediate_size wide).
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn: int = 0
    # Positions a windowed layer sees (config.json's sliding_window; which layers are
    # windowed is the architecture's rule), and the config's rope_scaling as published
    # ("linear" with its factor, or "llama3" with its four values).
    sliding_window: int = 0
    rope_scaling: dict[str, Any] | None = None

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def experts_label(self) -> str:
        """"128x8" (routed experts x experts per token) for a MoE preset, "" when dense."""
        return f"{self.n_experts}x{self.n_experts_used}" if self.is_moe else ""

    def values(self) -> dict[str, Any]:
        """Everything that shapes the written model (the content key hashes this).

        A dense preset leaves the MoE fields out: its values, and so the content keys of
        the synthetic files already in users' caches, are what they were before MoE.
        """
        values = asdict(self)
        if not self.is_moe:
            for key in MOE_FIELDS:
                del values[key]
        for key in OPTIONAL_FIELDS:
            if not values[key]:
                del values[key]
        return values


@lru_cache(maxsize=1)
def _load() -> dict[str, Any]:
    text = resources.files("strata.models").joinpath("data", PRESETS_FILE).read_text("utf-8")
    return json.loads(text)


def _from_json(name: str, raw: dict[str, Any]) -> Preset:
    known = {f.name for f in fields(Preset)} - {"name"}
    return Preset(name=name, **{k: v for k, v in raw.items() if k in known})


def list_presets() -> list[Preset]:
    """All presets, in the order of the data file."""
    return [_from_json(name, raw) for name, raw in _load()["presets"].items()]


def kernel_shape_presets() -> list[Preset]:
    """The presets whose shapes the kernel lab's shape sets are built from (a preset marked
    "kernel_shapes": false is there for planning only)."""
    raw = _load()["presets"]
    return [p for p in list_presets() if raw[p.name].get("kernel_shapes", True)]


def preset_names(include_test: bool = True) -> list[str]:
    """Every preset; without `include_test`, only published models' (the `tiny*` test
    models say "strata test model" as their source)."""
    presets = _load()["presets"]
    return [name for name, raw in presets.items()
            if include_test or not is_test_model(str(raw.get("source", "")))]


def is_test_model(source: str) -> bool:
    return source.startswith("strata test model")


def get_preset(name: str, ref: str | None = None) -> Preset:
    """The preset called `name`; InputError naming `ref` (what the user typed) if unknown."""
    raw = _load()["presets"].get(name)
    if raw is None:
        raise InputError(f"MODEL {ref or 'synthetic:' + name}: unknown preset (choose from "
                         f"{', '.join(preset_names())}; see strata bench --list-presets)")
    return _from_json(name, raw)


def default_model() -> str:
    """The embedded default model reference, e.g. "synthetic:smollm2-135m@q8_0"."""
    return f"synthetic:{_load()['default']}"
