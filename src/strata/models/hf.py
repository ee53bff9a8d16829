"""Hugging Face model directories: config.json + *.safetensors, read without loading weights.

The ModelSpec comes from config.json (shapes) and the safetensors *headers* (per-tensor
dtype, shape and exact bytes): 8-byte little-endian header length, then JSON. Nothing
here reads a weight, so a 16 GB model resolves in milliseconds.

Tensor names are mapped to the GGUF convention (spec.py) so the roofline code finds the
token embedding and the output head the same way for every source.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.errors import InputError
from strata.models.source import ResolvedModel, register
from strata.models.spec import OUTPUT, TOKEN_EMBD, ModelSpec, TensorInfo

# -- names: GGUF <-> HF (llama-family layout: llama, qwen2, mistral, ...) ----------------

# Model-level tensors.
GLOBAL_NAMES: dict[str, str] = {
    TOKEN_EMBD: "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    OUTPUT: "lm_head.weight",
}
# Per-layer tensors: GGUF "blk.{i}.<key>" <-> HF "model.layers.{i}.<value>".
LAYER_NAMES: dict[str, str] = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",  # gpt-oss
    "attn_sinks.weight": "self_attn.sinks",  # gpt-oss: one sink logit per head
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",  # qwen3 / qwen3moe per-head norms
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
_HF_GLOBAL = {v: k for k, v in GLOBAL_NAMES.items()}
_HF_LAYER = {v: k for k, v in LAYER_NAMES.items()}
_HF_LAYER_PREFIX = "model.layers."

# Mixture of experts. A checkpoint stores the router and one tensor per expert; strata names
# them blk.N.ffn_gate_inp.weight and blk.N.ffn_{gate,up,down}.E.weight (llama.cpp's router
# name and its old per-expert name), so spec.py finds the experts for every source.
# The HF side: "mlp" (Qwen2Moe/Qwen3Moe, OLMoE, ...) or "block_sparse_moe" (Mixtral).
MOE_STYLES: dict[str, dict[str, str]] = {
    "mlp": {"ffn_gate_inp": "mlp.gate", "ffn_gate": "mlp.experts.{e}.gate_proj",
            "ffn_up": "mlp.experts.{e}.up_proj", "ffn_down": "mlp.experts.{e}.down_proj"},
    "block_sparse_moe": {"ffn_gate_inp": "block_sparse_moe.gate",
                         "ffn_gate": "block_sparse_moe.experts.{e}.w1",
                         "ffn_up": "block_sparse_moe.experts.{e}.w3",
                         "ffn_down": "block_sparse_moe.experts.{e}.w2"},
}
_GGUF_EXPERT = re.compile(r"^blk\.(\d+)\.(ffn_gate|ffn_up|ffn_down)\.(\d+)\.weight$")
_HF_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
                        r"(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
_HF_ROUTER = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.(?:gate|router)\."
                        r"(weight|bias)$")  # gpt-oss: mlp.router, with a bias
# Checkpoints saved by transformers 5 hold each layer's experts fused in 3-D tensors
# (gpt-oss's with an [E, N] bias beside each).
_HF_FUSED = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?$")
_EXPERT_PROJ = {"gate_proj": "ffn_gate", "w1": "ffn_gate", "up_proj": "ffn_up", "w3": "ffn_up",
                "down_proj": "ffn_down", "w2": "ffn_down"}


def hf_name(gguf_name: str, moe_style: str = "mlp", names: dict[str, str] | None = None
            ) -> str:
    """HF name of a GGUF-named tensor of the llama-family layout (KeyError if unknown);
    `moe_style` says how the checkpoint names experts and router (a key of MOE_STYLES),
    `names` an architecture's own names of layer tensors (Arch.transformers_names)."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    style = MOE_STYLES[moe_style]
    expert = _GGUF_EXPERT.match(gguf_name)
    if expert is not None:
        layer, proj, e = expert.groups()
        return f"{_HF_LAYER_PREFIX}{layer}.{style[proj].format(e=e)}.weight"
    _blk, layer, key = gguf_name.split(".", 2)
    if names and key in names:
        return f"{_HF_LAYER_PREFIX}{layer}.{names[key]}"
    if key == "ffn_gate_inp.weight":
        return f"{_HF_LAYER_PREFIX}{layer}.{style['ffn_gate_inp']}.weight"
    return f"{_HF_LAYER_PREFIX}{layer}.{LAYER_NAMES[key]}"


def gguf_name(name: str) -> str:
    """GGUF name of an HF tensor; names outside the known layout are kept as they are
    (they still count their bytes, they just are not the embedding or the head)."""
    if name in _HF_GLOBAL:
        return _HF_GLOBAL[name]
    if (m := _HF_EXPERT.match(name)) is not None:
        layer, e, proj = m.groups()
        return f"blk.{layer}.{_EXPERT_PROJ[proj]}.{e}.weight"
    if (m := _HF_ROUTER.match(name)) is not None:
        return f"blk.{m.group(1)}.ffn_gate_inp.{m.group(2)}"
    if (m := _HF_FUSED.match(name)) is not None:
        proj = "ffn_gate_up" if m.group(2) == "gate_up_proj" else "ffn_down"
        return f"blk.{m.group(1)}.{proj}_exps.{'bias' if m.group(3) else 'weight'}"
    if name.startswith(_HF_LAYER_PREFIX):
        layer, _, rest = name[len(_HF_LAYER_PREFIX):].partition(".")
        if layer.isdigit() and rest in _HF_LAYER:
            return f"blk.{layer}.{_HF_LAYER[rest]}"
    return name


# -- safetensors headers -------------------------------------------------------------------

# Bytes per element of every safetensors dtype with a whole-byte size.
DTYPE_BYTES: dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}
# safetensors itself refuses headers above 100 MB; so do we, before reading one.
MAX_HEADER = 100 * 1000 * 1000
INDEX_FILE = "model.safetensors.index.json"


def _bad(path: Path, why: str) -> InputError:
    return InputError(f"MODEL {path}: {why}")


def _header_json(path: Path) -> tuple[dict[str, Any], int]:
    """(JSON header, bytes of tensor data after it); the header's length is checked against
    the file before it is read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad(path, f"{size}-byte file is too short to be safetensors (truncated)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, MAX_HEADER):
            raise _bad(path, f"safetensors header claims {n} bytes but the file has {size} "
                             "(truncated or not a safetensors file)")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"safetensors header is not valid JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise _bad(path, "safetensors header is not a JSON object")
    return header, size - 8 - n


def _is_shape(shape: Any) -> bool:
    return isinstance(shape, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)


def _tensor(path: Path, name: str, entry: Any, data_bytes: int) -> TensorInfo:
    """One header entry, checked: known dtype, sane shape, offsets inside the data and
    exactly as long as the shape says (a header that lies fails here)."""
    if not isinstance(entry, dict):
        raise _bad(path, f"tensor {name!r}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise _bad(path, f"tensor {name!r}: unknown dtype {dtype!r} (known: "
                         f"{', '.join(DTYPE_BYTES)})")
    if not _is_shape(shape):
        raise _bad(path, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    if not (_is_shape(offsets) and len(offsets) == 2 and offsets[0] <= offsets[1]):
        raise _bad(path, f"tensor {name!r}: data_offsets {offsets!r} are not [begin, end]")
    elements = 1
    for d in shape:
        elements *= d
    nbytes = elements * DTYPE_BYTES[dtype]
    begin, end = offsets
    if end > data_bytes:
        raise _bad(path, f"tensor {name!r}: data_offsets end at {end} but the file holds "
                         f"{data_bytes} bytes of data (header lies, or file truncated)")
    if end - begin != nbytes:
        raise _bad(path, f"tensor {name!r}: data_offsets span {end - begin} bytes but "
                         f"{dtype}{shape} needs {nbytes} (the header lies)")
    return TensorInfo(gguf_name(name), tuple(shape), dtype, nbytes)


def read_safetensors_header(path: Path) -> list[TensorInfo]:
    """Per-tensor dtype, shape and bytes of one .safetensors file, from its header only."""
    try:
        header, data_bytes = _header_json(path)
    except OSError as exc:
        raise _bad(path, f"cannot read it: {exc.strerror or exc}") from exc
    return [_tensor(path, name, entry, data_bytes)
            for name, entry in header.items() if name != "__metadata__"]


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files: those the shard index names, else every *.safetensors."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text("utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise _bad(index, f"unreadable shard index ({exc!r})") from exc
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise _bad(folder, f"shard {missing[0]} named by {INDEX_FILE} is missing "
                               f"({len(missing)} of {len(names)} missing: download them all)")
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise _bad(folder, "no *.safetensors weights (strata reads safetensors only; save "
                           "the model with safe_serialization=True)")
    return files


# -- config.json ---------------------------------------------------------------------------

CONFIG_FILE = "config.json"
REQUIRED_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "vocab_size")


@dataclass(frozen=True)
class HfConfig:
    path: Path
    values: dict[str, Any]

    def count(self, key: str, default: int | None = None) -> int:
        value = self.values.get(key)
        if value is None:  # absent, or null (e.g. "head_dim": null)
            if default is None:
                raise _bad(self.path, f"config.json lacks {key} (required: "
                                      f"{', '.join(REQUIRED_KEYS)})")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _bad(self.path, f"config.json {key} = {value!r} is not a non-negative "
                                  "integer")
        return value


def read_config(folder: Path) -> HfConfig:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise _bad(folder, "directory has no config.json (a Hugging Face model directory "
                           "holds config.json and *.safetensors)")
    try:
        values = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(path, f"not valid JSON ({exc})") from exc
    if not isinstance(values, dict):
        raise _bad(path, "not a JSON object")
    # Multimodal wrappers keep the language model's shapes in text_config.
    text = values.get("text_config")
    if "hidden_size" not in values and isinstance(text, dict):
        values = {**values, **text}
    return HfConfig(path, values)


# config.json keys of the routed-expert count, by model family (first one present wins).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def _moe(cfg: HfConfig, ffn: int) -> dict[str, int]:
    """n_experts, n_experts_used and expert_ffn from config.json (all 0 for a dense model).
    An expert is moe_intermediate_size wide, or intermediate_size (Mixtral) without it."""
    n = next((cfg.count(k) for k in EXPERT_COUNT_KEYS if cfg.values.get(k) is not None), 0)
    if n == 0:
        return {}
    return {"n_experts": n, "n_experts_used": cfg.count("num_experts_per_tok", 1),
            "expert_ffn": cfg.count("moe_intermediate_size", ffn)}


def spec_from_dir(folder: Path) -> ModelSpec:
    """ModelSpec of an HF directory: shapes from config.json, bytes from safetensors headers."""
    cfg = read_config(folder)
    hidden, n_heads = cfg.count("hidden_size"), cfg.count("num_attention_heads")
    ffn, n_layers, vocab = (cfg.count("intermediate_size"), cfg.count("num_hidden_layers"),
                            cfg.count("vocab_size"))
    if n_heads == 0:
        raise _bad(cfg.path, "config.json num_attention_heads is 0")
    tensors = [t for f in safetensors_files(folder) for t in read_safetensors_header(f)]
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise _bad(folder, "the same tensor appears in more than one safetensors file")
    has_head = OUTPUT in names
    tied = bool(cfg.values.get("tie_word_embeddings", False)) or not has_head
    arch = cfg.values.get("model_type") or "unknown"
    return ModelSpec(
        name=folder.name, arch=str(arch), n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=cfg.count("num_key_value_heads", n_heads),
        head_dim=cfg.count("head_dim", hidden // n_heads), hidden=hidden, ffn=ffn, vocab=vocab,
        ctx_max=cfg.count("max_position_embeddings", 0), tied_embeddings=tied,
        tensors=tensors, source="hf",
        notes=[] if has_head or cfg.values.get("tie_word_embeddings") else
        ["no lm_head.weight in the safetensors: the head reuses the embedding (tied)"],
        **_moe(cfg, ffn),
    )


@register("hf")
def resolve_hf(ref: str, model_name: str | None) -> ResolvedModel | None:
    folder = Path(ref).expanduser()
    if not folder.is_dir():
        return None
    return ResolvedModel(ref=ref, kind="hf", spec=spec_from_dir(folder), model_name=model_name,
                         artefacts={"hf": folder})
