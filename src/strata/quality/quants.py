"""`strata quality MODEL --quants q8_0,q4_k_m,...`: the F16/F32 GGUF re-quantised to each of
llama.cpp's mixes by llama.cpp's own quantizer (the files people download are made exactly
so), each scored against MODEL as the reference (PPL, KL, top-1, the speed ratio).

The quantised files are cached next to the synthetic models, keyed by the source file (path,
size, modification time), the mix and the llama.cpp build, so a second run scores at once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from strata.errors import InputError
from strata.models.mixes import MIXES, Mix
from strata.models.source import resolve

FLOATS = ("F32", "F16", "BF16")


def parse_quants(text: str) -> list[Mix]:
    """"q8_0,q4_k_m" -> the mixes, in the order given (InputError names the choices)."""
    keys = [k.strip().lower() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MIXES]
    if unknown or not keys:
        raise InputError(f"--quants {text}: choose from {', '.join(MIXES)} (comma-separated)")
    return [MIXES[k] for k in dict.fromkeys(keys)]


def _source(model_ref: str) -> Path:
    """The float GGUF behind MODEL (a quantised one cannot be the reference of its mixes)."""
    model = resolve(model_ref)
    spec = model.spec_for("gguf")
    if spec is None:
        raise InputError(f"MODEL {model_ref}: --quants re-quantises a GGUF; this model has no "
                         "GGUF form")
    if spec.main_dtype() not in FLOATS:
        raise InputError(f"MODEL {model_ref}: --quants needs the f16/f32 file as the reference; "
                         f"this one is {spec.quant_label()} already")
    return Path(model.path("gguf", "quality --quants"))


def _cached(src: Path, mix: Mix) -> Path:
    from strata.backends.llamacpp_quantize import quantizer_version
    from strata.paths import cache_dir

    st = src.stat()
    blob = f"{src.resolve()}|{st.st_size}|{st.st_mtime_ns}|{mix.name}|{quantizer_version()}"
    key = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return cache_dir() / "quants" / key / f"{src.stem}-{mix.name}.gguf"


def mix_files(model_ref: str, mixes: list[Mix],
              say: Callable[[str], None] = lambda m: None) -> list[tuple[Mix, Path]]:
    """(mix, the MODEL file at that mix), written by llama.cpp's quantizer where not cached."""
    from strata.backends.llamacpp_quantize import quantize_gguf

    src = _source(model_ref)
    out = []
    for mix in mixes:
        dst = _cached(src, mix)
        if not dst.exists():
            say(f"quantising {src.name} to {mix.name} with llama.cpp's quantizer…")
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_suffix(f".tmp-{os.getpid()}")
            try:
                quantize_gguf(src, tmp, mix.ftype)
                os.replace(tmp, dst)  # readers see the whole file or none
            finally:
                tmp.unlink(missing_ok=True)
        out.append((mix, dst))
    return out
