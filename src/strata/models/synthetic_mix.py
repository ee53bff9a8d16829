"""Synthetic presets at llama.cpp's K-quant mixes (`synthetic:llama-3.2-1b@q4_k_m`): the f16
preset, quantised by llama.cpp's own quantizer — real Q4_K/Q6_K/... blocks laid out by
llama.cpp's per-tensor rules, as the files people download are. The tensor plan is known
before anything is written (models/mixes.py restates the rules; tests compare it with what
llama.cpp writes, byte for byte), so `strata fit` sizes the preset without writing it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from strata.models.mixes import MIXES, Mix, requantised
from strata.models.spec import ModelSpec

if TYPE_CHECKING:
    from strata.models.synthetic import SyntheticModel

SOURCE = "f16"  # what llama-quantize reads: the converter's f16 file


def mix_of(model: SyntheticModel) -> Mix:
    return MIXES[model.quant]


def source_model(model: SyntheticModel) -> SyntheticModel:
    from strata.models.synthetic import SyntheticModel

    return SyntheticModel(model.preset, SOURCE)


def mix_spec(model: SyntheticModel) -> ModelSpec:
    """The preset's tensors as llama-quantize stores them at the mix (nothing written)."""
    src = source_model(model).gguf_spec()
    mix = mix_of(model)
    notes = [*src.notes[:1], f"written by llama.cpp's quantizer from the {SOURCE} preset "
             f"({mix.name}: llama.cpp's per-tensor rules)"]
    return replace(src, name=model.ref, tensors=requantised(src, mix), file_type=mix.name,
                   notes=notes)


def write_mix(model: SyntheticModel, dest: Path) -> None:
    """Quantise the f16 preset (written first, cached like any preset) into `dest`."""
    from strata.backends.llamacpp_quantize import quantize_gguf

    quantize_gguf(source_model(model).gguf_path(), dest, mix_of(model).ftype)


def writer_tag() -> str:
    """Part of the cache key: the llama.cpp build that quantises."""
    from strata.backends.llamacpp_quantize import quantizer_version

    return f"llama.cpp {quantizer_version()}"
