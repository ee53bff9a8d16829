"""llama.cpp's quantisation mixes: which storage type `llama-quantize` gives each tensor.

A "Q4_K_M" file is not one type: llama.cpp's quantizer (src/llama-quant.cpp,
`llama_tensor_get_type`) picks a type per tensor from the mix's default, the tensor's role
(attn_v, ffn_down, output, ...), its layer and the model's shape (grouped-query ratio,
experts), then falls back to a type whose block divides the row when the default's does not
(Q4_K -> Q5_0, Q6_K -> Q8_0, ...). This module restates those rules for the mixes people
choose between, from names and shapes alone, so `strata fit` sizes a mix exactly and the
synthetic K-quant presets know their tensor plan before llama.cpp writes the file
(tests/test_mixes.py compares every rule with real llama.cpp quantisation, byte for byte).

Not covered (they need more than shapes): an importance matrix (IQ types), Falcon's own
rules, and llama.cpp's `--tensor-type` / `--pure` overrides.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from strata.models.spec import ModelSpec, TensorInfo

# llama.cpp's LLAMA_FTYPE values (general.file_type) -> the names its tools print.
FTYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE",
}


@dataclass(frozen=True)
class Mix:
    name: str  # as llama.cpp names the file type: "Q4_K_M"
    ftype: int  # LLAMA_FTYPE
    default: str  # the GGML type of a matrix no rule singles out

    @property
    def key(self) -> str:  # how strata spells it after "@": q4_k_m
        return self.name.lower()

    @property
    def quantized(self) -> bool:
        return self.default not in ("F16", "BF16", "F32")


# What users choose between (the order `strata fit` lists them in).
MIXES: dict[str, Mix] = {m.key: m for m in (
    Mix("Q8_0", 7, "Q8_0"), Mix("Q6_K", 18, "Q6_K"), Mix("Q5_K_M", 17, "Q5_K"),
    Mix("Q4_K_M", 15, "Q4_K"), Mix("Q4_0", 2, "Q4_0"), Mix("Q3_K_M", 12, "Q3_K"),
    Mix("Q2_K", 10, "Q2_K"), Mix("F16", 1, "F16"),
)}

# GGML type -> (values per block, bytes per block), as ggml lays them out (ggml-common.h).
BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34),
    "IQ4_NL": (32, 18), "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144),
    "Q5_K": (256, 176), "Q6_K": (256, 210),
}

# A type whose block does not divide a row -> the type llama.cpp stores that row in instead.
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def nbytes(dtype: str, elements: int) -> int:
    block, size = BLOCKS[dtype]
    return elements // block * size


# -- the model facts the rules read ---------------------------------------------------------

@dataclass
class _Model:
    n_layers: int
    gqa: int  # query heads per KV head
    n_experts: int
    is_70b: bool  # llama.cpp's LLM_TYPE_70B: attn_v gets Q5_K instead of Q3_K/Q4_K
    tied: bool  # no output.weight: token_embd is quantised like the head
    n_attn_v: int
    i_attn_v: int = 0  # attn_v tensors seen so far (llama.cpp counts them in file order)


def _model(spec: ModelSpec) -> _Model:
    names = [t.name for t in spec.tensors]
    return _Model(n_layers=spec.n_layers, gqa=spec.n_heads // max(1, spec.n_kv_heads),
                  n_experts=spec.n_experts,
                  is_70b=spec.arch == "llama" and spec.n_layers == 80 and
                  spec.n_heads != spec.n_kv_heads,
                  tied="output.weight" not in names,
                  n_attn_v=sum(_category(n) == "attn_v" for n in names))


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third
    layer in between, get the larger type."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


_LAYER = re.compile(r"blk\.(\d+)\.")


def _layer(name: str) -> int:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else -1  # llama.cpp sorts tensors outside layers first


def _category(name: str) -> str:
    """llama.cpp's tensor category (substring tests, in its order)."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"),
                      ("attn_v.weight", "attn_v"), ("attn_k.weight", "attn_k"),
                      ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
                      ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                      ("ffn_down", "ffn_down")):
        if part in name:
            return cat
    return "other"


def quantizable(t: TensorInfo) -> bool:
    """Whether llama.cpp's quantizer touches the tensor at all (else it keeps its type)."""
    n = t.name
    return (len(t.shape) >= 2 and n.endswith("weight") and "_norm.weight" not in n
            and "ffn_gate_inp.weight" not in n and "ssm_conv1d" not in n)


# -- the rules, per category ----------------------------------------------------------------
Rule = Callable[[Mix, TensorInfo, _Model, str], str]


def _head(mix: Mix, t: TensorInfo, m: _Model, new: str) -> str:
    if t.shape[-1] % BLOCKS[new][0]:
        return "Q8_0"
    return new if new == "Q8_0" else "Q6_K"


def _attn_v(mix: Mix, t: TensorInfo, m: _Model, new: str) -> str:
    i = m.i_attn_v
    m.i_attn_v += 1
    if mix.name == "Q2_K":
        new = "Q4_K" if m.gqa >= 4 else "Q3_K"
    elif mix.name == "Q3_K_M":
        new = "Q5_K" if i < 2 else "Q4_K"
    elif mix.name in ("Q4_K_M", "Q5_K_M") and _more_bits(i, m.n_attn_v):
        new = "Q6_K"
    if m.is_70b and new in ("Q3_K", "Q4_K"):
        new = "Q5_K"
    return "Q8_0" if m.n_experts == 8 else new


def _attn_k(mix: Mix, t: TensorInfo, m: _Model, new: str) -> str:
    return "Q8_0" if m.n_experts == 8 else new


def _ffn_down(mix: Mix, t: TensorInfo, m: _Model, new: str) -> str:
    i, n = _layer(t.name), m.n_layers
    if mix.name == "Q2_K":
        return "Q3_K"
    if mix.name == "Q3_K_M":
        return "Q5_K" if i < n // 16 else "Q4_K"
    if mix.name in ("Q4_K_M", "Q5_K_M") and _more_bits(i, n):
        return "Q6_K"
    return new


def _attn_output(mix: Mix, t: TensorInfo, m: _Model, new: str) -> str:
    if m.n_experts == 8:
        return "Q5_K" if mix.name in ("Q2_K", "Q3_K_M", "Q4_K_M") else new
    return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K"}.get(mix.name, new)


RULES: dict[str, Rule] = {"output": _head, "attn_v": _attn_v, "attn_k": _attn_k,
                          "ffn_down": _ffn_down, "attn_output": _attn_output}


def _fallback(t: TensorInfo, new: str) -> str:
    cols = t.shape[-1]
    if cols % BLOCKS[new][0] == 0:
        return new
    other = FALLBACK.get(new, "F16")
    return other if cols % BLOCKS[other][0] == 0 else "F16"


def _source_type(t: TensorInfo) -> str:
    """What a tensor the quantizer keeps is stored as: what llama.cpp's converter wrote it
    as — 1-D tensors (norms, biases) always F32, a kept matrix (the MoE router) in its own
    float type (a Hugging Face checkpoint's bf16 norms become F32 in the GGUF)."""
    if len(t.shape) < 2:
        return "F32"
    return t.dtype if t.dtype in ("F32", "F16", "BF16") else "F32"


def tensor_types(spec: ModelSpec, mix: Mix) -> dict[str, str]:
    """Tensor name -> the type llama-quantize stores it in for `mix` (from an F16/F32
    source; tensors in file order, as llama.cpp visits them)."""
    m = _model(spec)
    out = {}
    for t in sorted(spec.tensors, key=lambda t: (_layer(t.name), t.name)):
        if not quantizable(t):
            out[t.name] = _source_type(t)
            continue
        new = mix.default
        if mix.quantized:
            cat = _category(t.name)
            if cat == "token_embd" and m.tied:
                cat = "output"
            rule = RULES.get(cat)
            new = _fallback(t, rule(mix, t, m, new) if rule else new)
        out[t.name] = new
    return out


def requantised(spec: ModelSpec, mix: Mix) -> list[TensorInfo]:
    """`spec`'s tensors as llama-quantize would store them at `mix` (same order)."""
    types = tensor_types(spec, mix)
    return [TensorInfo(t.name, t.shape, types[t.name], nbytes(types[t.name], t.elements))
            for t in spec.tensors]


def file_type_name(ftype: int | None) -> str | None:
    """"Q4_K_M" for general.file_type 15; None when absent or unknown."""
    return FTYPE_NAMES.get(ftype) if ftype is not None else None
