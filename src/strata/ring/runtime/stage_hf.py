"""A ring stage's weights from a Hugging Face folder (config.json + *.safetensors).

Only the tensors the stage needs are read: strata.models.hf parses every file's header
(bounds-checked: offsets inside the file, lengths as the dtype and shape say), then the
stage seeks to its own tensors' bytes and reads those alone, so a middle stage never touches
the embedding, the head or another stage's layers. Sharded checkpoints (an index naming
several files) are read the same way, file by file.

Tensors are kept under their GGUF names (strata.models.hf.gguf_name), which is what the
stage's forward pass looks up. Unlike a GGUF, an HF checkpoint stores Q/K rows in
transformers' own rotate-half order, so nothing is unpermuted here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from strata.errors import InputError
from strata.models.gguf_torch import ARCHS, ArchRule
from strata.models.hf import (
    HfConfig,
    _header_json,
    _tensor,
    read_config,
    safetensors_files,
    spec_from_dir,
)
from strata.models.spec import OUTPUT, TOKEN_EMBD, ModelSpec

# safetensors dtypes a stage widens to float32 (quantised or integer weights have no place)
_FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
# GGUF-named block tensors a dense Llama/Qwen2 stage computes with
BLOCK_TENSORS = frozenset({
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_q.bias",
    "attn_k.bias", "attn_v.bias", "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight",
    "ffn_up.weight", "ffn_down.weight",
})


def hf_folder(model_ref: str) -> Path | None:
    """The folder of a model ref that resolves to a Hugging Face directory, else None (a
    GGUF, or a synthetic preset: those keep the GGUF path)."""
    from strata.models.source import resolve

    model = resolve(model_ref)
    if model.kind != "hf":
        return None
    return model.path("hf", "ring")


def hf_rule(folder: Path, spec: ModelSpec) -> ArchRule:
    rule = ARCHS.get(spec.arch)
    if rule is None:
        raise InputError(f"MODEL {folder}: strata ring runs the {', '.join(ARCHS)} "
                         f"architectures from a Hugging Face folder, not {spec.arch}")
    if spec.n_kv_heads == 0 or spec.n_heads % spec.n_kv_heads:
        raise InputError(f"MODEL {folder}: {spec.n_heads} attention heads do not share "
                         f"{spec.n_kv_heads} KV heads evenly")
    if spec.is_moe:
        raise InputError(f"MODEL {folder}: strata ring runs mixture-of-experts models from "
                         "a GGUF only (convert it, or give the GGUF)")
    return rule


def _number(cfg: HfConfig, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"MODEL {cfg.path}: config.json {key} = {value!r} is not a number")
    return float(value)


def hf_config(folder: Path, spec: ModelSpec) -> dict[str, Any]:
    """What the stage's forward needs from config.json: eps, RoPE theta and scaling, vocab.
    transformers 5 writes theta and the scaling inside rope_parameters; 4.x at the top."""
    cfg = read_config(folder)
    v = cfg.values
    rope = v.get("rope_parameters") or v.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise InputError(f"MODEL {cfg.path}: config.json rope parameters {rope!r} are not "
                         "an object")
    theta = _number(cfg, "rope_theta", rope.get("rope_theta", v.get("rope_theta", 10000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    scaling: dict[str, Any] | None = None
    if kind == "linear":
        scaling = {"rope_type": "linear",
                   "factor": _number(cfg, "rope factor", rope.get("factor"))}
    elif kind != "default":  # llama3/yarn/... would change every angle: refuse, not drift
        raise InputError(f"MODEL {cfg.path}: RoPE type {kind!r}; a ring stage runs default "
                         "or linear RoPE from a Hugging Face folder")
    eps = _number(cfg, "rms_norm_eps", v.get("rms_norm_eps", 1e-6))
    act = v.get("hidden_act", "silu")
    if act != "silu":
        raise InputError(f"MODEL {cfg.path}: hidden_act {act!r}; a ring stage runs SwiGLU "
                         "(silu)")
    return {"vocab_size": spec.vocab, "rms_norm_eps": eps, "rope_theta": theta,
            "rope_scaling": scaling}


def stage_wanted(name: str, first: int, last: int, spec: ModelSpec) -> bool:
    """Does the stage [first, last) need the GGUF-named tensor `name` of an HF folder?"""
    if name.startswith("blk."):
        index = name.split(".", 2)[1]
        return index.isdigit() and first <= int(index) < last
    if name == TOKEN_EMBD:  # the lookup on the first stage; the tied head on the last
        return first == 0 or (spec.tied_embeddings and last == spec.n_layers)
    if name == OUTPUT:  # a tied model's lm_head (if saved at all) is the embedding again
        return last == spec.n_layers and not spec.tied_embeddings
    return name == "output_norm.weight" and last == spec.n_layers


def read_tensor(path: Path, name: str, offset: int, dtype: str, shape: tuple[int, ...]
                ) -> np.ndarray:
    """float32 values of tensor `name`, whose bytes start at file offset `offset` (the header
    has already checked that they lie inside the file). The one place tensor bytes are read:
    the tests count what a stage reads here."""
    count = int(np.prod(shape, dtype=np.int64))
    with open(path, "rb") as f:
        f.seek(offset)
        raw = np.fromfile(f, dtype=_FLOAT_DTYPES[dtype], count=count)
    if raw.size != count:  # the file shrank after its header was checked
        raise InputError(f"MODEL {path}: tensor {name!r} ends early (file truncated)")
    if dtype == "BF16":  # bfloat16 is the top half of a float32
        values = (raw.astype(np.uint32) << 16).view(np.float32)
    else:
        values = raw.astype(np.float32)
    return values.reshape(shape)


def read_stage_hf(folder: Path, spec: ModelSpec, first: int, last: int
                  ) -> dict[str, np.ndarray]:
    """The stage's tensors (GGUF names, float32), read one at a time from the safetensors."""
    out: dict[str, np.ndarray] = {}
    for path in safetensors_files(folder):
        try:
            header, data_bytes = _header_json(path)
            start = path.stat().st_size - data_bytes  # 8 + header length
        except OSError as exc:
            raise InputError(f"MODEL {path}: cannot read it: {exc.strerror or exc}") from exc
        for hf_name, entry in header.items():
            if hf_name == "__metadata__":
                continue
            info = _tensor(path, hf_name, entry, data_bytes)  # every entry checked
            if not stage_wanted(info.name, first, last, spec):
                continue
            if info.name.startswith("blk.") and info.name.split(".", 2)[2] not in \
                    BLOCK_TENSORS:
                raise InputError(f"MODEL {path}: tensor {hf_name!r} has no place in a "
                                 "dense Llama-family stage (another variant?)")
            if info.dtype not in _FLOAT_DTYPES:
                raise InputError(f"MODEL {path}: tensor {hf_name!r} is {info.dtype}; a "
                                 f"stage reads {', '.join(_FLOAT_DTYPES)}")
            out[info.name] = read_tensor(path, hf_name, start + entry["data_offsets"][0],
                                         info.dtype, info.shape)
    need = [n for n in (TOKEN_EMBD if first == 0 else None,
                        "output_norm.weight" if last == spec.n_layers else None) if n]
    missing = [n for n in need if n not in out]
    if last == spec.n_layers and OUTPUT not in out and TOKEN_EMBD not in out:
        missing.append(OUTPUT)
    if missing:
        raise InputError(f"MODEL {folder}: the safetensors hold no {missing[0]} (an "
                         "incomplete checkpoint?)")
    return out


def load_hf(folder: Path) -> tuple[ModelSpec, ArchRule, dict[str, Any]]:
    """(spec, arch rule, forward config) of an HF folder, from headers and config.json."""
    spec = spec_from_dir(folder)
    rule = hf_rule(folder, spec)
    return spec, rule, hf_config(folder, spec)
