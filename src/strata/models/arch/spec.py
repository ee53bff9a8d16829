"""What an architecture declares: its tensors and their roles, and its variants.

A layer's tensors are named by role (the executor's vocabulary) and mapped to the GGUF suffix
after `blk.N.`. Which variant a layer runs follows from the roles it declares: q/k norms are
applied where `q_norm`/`k_norm` are declared, q/k/v biases where the file has them (they are
optional roles), routed experts where the file says `{arch}.expert_count` > 0 (then the
EXPERT_ROLES replace the dense MLP's). What is not a tensor is a field: the RoPE pairing, the
MLP's activation, the embedding scale.

Sliding-window attention is a field: `swa_pattern` says which layers attend only to the last
`{arch}.attention.sliding_window` positions (the file says how many), with llama.cpp's rule,
and `swa_rope_base` the RoPE base of those layers where it differs from the file's. Variants
the executor does not run yet (logit soft-capping, attention sinks) arrive with the
architectures that need them: each is a field or a role here and a branch in
`strata.engine`, nowhere else. gpt-oss brought three: attention sinks (a `sinks` role: one
learned logit per head in the softmax's denominator), biases on the output projection, the
router and the experts (optional roles, added where the file has them), and its clamped
SwiGLU (`mlp="swiglu_oai"`) with routing weights softmaxed over the chosen experts only
(`gating="softmax_weight"`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from strata.errors import InputError

# RoPE pairing as llama.cpp names it. "normal": adjacent pairs (2i, 2i+1) — llama.cpp's
# converter permuted the q/k rows of HF's half-split so they rotate that way, and the loader
# undoes the permutation; "neox": half-split pairs (i, i + D/2) on the rows as stored.
ROPE_KINDS = ("normal", "neox")
# MLP kind -> the activation of its gate (the up projection multiplies it)
MLP_KINDS = {"swiglu": "silu", "geglu": "gelu", "swiglu_oai": "swiglu_oai"}
# how routed experts are weighed (strata.engine.moe): "softmax" over every expert, the top k
# renormalised; "softmax_weight" (gpt-oss) top k of the raw logits, softmaxed among themselves
GATINGS = ("softmax", "softmax_weight")
EMBED_SCALES = ("none", "sqrt_hidden")
NORMS = ("rms",)

GLOBAL_TENSORS = {"token_embd": "token_embd.weight", "output_norm": "output_norm.weight",
                  "output": "output.weight"}
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.x frequency factors (one per model)
# Phi-3's LongRoPE factors: llama.cpp rotates with the long ones when the context is longer
# than {arch}.rope.scaling.original_context_length, else the short ones (chosen per cache)
ROPE_LONG, ROPE_SHORT = "rope_factors_long.weight", "rope_factors_short.weight"
ROPE_TENSORS = (ROPE_FREQS, ROPE_LONG, ROPE_SHORT)


@dataclass(frozen=True)
class LayerTensor:
    role: str  # the executor's name for it
    suffix: str  # GGUF name after "blk.N."
    optional: bool = False


def t(role: str, suffix: str, optional: bool = False) -> LayerTensor:
    return LayerTensor(role, suffix, optional)


# The usual pieces, for architecture files to compose.
ATTENTION = (t("attn_norm", "attn_norm.weight"), t("q", "attn_q.weight"),
             t("k", "attn_k.weight"), t("v", "attn_v.weight"),
             t("o", "attn_output.weight"))
QKV_BIASES = (t("q_bias", "attn_q.bias", True), t("k_bias", "attn_k.bias", True),
              t("v_bias", "attn_v.bias", True))
QK_NORMS = (t("q_norm", "attn_q_norm.weight"), t("k_norm", "attn_k_norm.weight"))
# Phi-3's fused projections: one matrix for q, k and v (rows in that order), one for the
# MLP's gate and up (the first half of its rows the gate)
FUSED_ATTENTION = (t("attn_norm", "attn_norm.weight"), t("qkv", "attn_qkv.weight"),
                   t("o", "attn_output.weight"))
FUSED_MLP = (t("ffn_norm", "ffn_norm.weight"), t("gate_up", "ffn_up.weight"),
             t("down", "ffn_down.weight"))
# Gemma's norms of the attention and MLP outputs, before each joins the residual stream
POST_NORMS = (t("attn_post_norm", "post_attention_norm.weight"),
              t("ffn_post_norm", "post_ffw_norm.weight"))
DENSE_MLP = (t("ffn_norm", "ffn_norm.weight"), t("gate", "ffn_gate.weight"),
             t("up", "ffn_up.weight"), t("down", "ffn_down.weight"))
EXPERTS = (t("ffn_norm", "ffn_norm.weight"), t("router", "ffn_gate_inp.weight"),
           t("gate_exps", "ffn_gate_exps.weight"), t("up_exps", "ffn_up_exps.weight"),
           t("down_exps", "ffn_down_exps.weight"))
# gpt-oss: biases on the output projection, the router and every expert's three matrices
# (per expert: [E, N]), and the attention sinks (one logit per query head)
O_BIAS = (t("o_bias", "attn_output.bias", True),)
SINKS = (t("sinks", "attn_sinks.weight"),)
EXPERT_BIASES = (t("router_bias", "ffn_gate_inp.bias", True),
                 t("gate_exps_bias", "ffn_gate_exps.bias", True),
                 t("up_exps_bias", "ffn_up_exps.bias", True),
                 t("down_exps_bias", "ffn_down_exps.bias", True))
DENSE_ROLES = frozenset({"gate", "up", "down", "gate_up"})
EXPERT_ROLES = frozenset({"router", "gate_exps", "up_exps", "down_exps", "router_bias",
                          "gate_exps_bias", "up_exps_bias", "down_exps_bias"})


# How transformers checkpoints lay routed experts out (strata.models.synthetic_moe writes
# each): one tensor per expert and matrix, or gpt-oss's fused, interleaved gate/up.
TRANSFORMERS_EXPERTS = ("per_expert", "fused_gate_up")


@dataclass(frozen=True)
class Arch:
    """One architecture, as llama.cpp's GGUF names it (`general.architecture`)."""

    name: str
    layer: tuple[LayerTensor, ...]  # every tensor a layer may hold (dense and expert forms)
    rope: str = "normal"
    mlp: str = "swiglu"
    norm: str = "rms"
    embed_scale: str = "none"
    experts: str = "never"  # "never" | "optional" (a dense or MoE file) | "always"
    gating: str = "softmax"  # how the routed experts are weighed (GATINGS)
    model_type: str | None = None  # transformers' AutoConfig key, where one exists
    # Sliding window (where the file sets {arch}.attention.sliding_window): None, no layer;
    # 0, every layer; n, llama.cpp's set_swa_pattern(n): layer i is windowed when
    # i % n < n - 1 (every n-th layer attends to everything)
    swa_pattern: int | None = None
    swa_rope_base: float | None = None  # RoPE base of the windowed layers (None: the file's)
    # The GGML type the published files store routed experts in whatever their other
    # matrices (gpt-oss: MXFP4, as released): synthetic presets at a quantised @quant do too
    expert_storage: str | None = None
    transformers_extra: dict[str, Any] = field(default_factory=dict)
    # transformers' names where they differ from the llama family's (strata.models.hf
    # LAYER_NAMES), by GGUF suffix after blk.N.
    transformers_names: dict[str, str] = field(default_factory=dict)
    # How a transformers checkpoint stores the routed experts (TRANSFORMERS_EXPERTS):
    # one 2-D tensor per expert, or gpt-oss's fused gate_up_proj [E, hidden, 2·ffn]
    transformers_experts: str = "per_expert"
    # What llama.cpp's converter added to every norm weight (Gemma's 1: transformers'
    # Gemma norms multiply by 1 + w); the transformers loader takes it off again.
    norm_offset: float = 0.0

    def __post_init__(self) -> None:
        for value, allowed, what in ((self.rope, ROPE_KINDS, "rope"),
                                     (self.mlp, tuple(MLP_KINDS), "mlp"),
                                     (self.norm, NORMS, "norm"),
                                     (self.embed_scale, EMBED_SCALES, "embed_scale"),
                                     (self.gating, GATINGS, "gating"),
                                     (self.transformers_experts, TRANSFORMERS_EXPERTS,
                                      "transformers_experts"),
                                     (self.experts, ("never", "optional", "always"),
                                      "experts")):
            if value not in allowed:
                raise ValueError(f"architecture {self.name}: {what}={value!r}, not one of "
                                 f"{', '.join(allowed)}")
        # the pieces may share a tensor (ffn_norm precedes a dense MLP and experts alike)
        unique = tuple(dict.fromkeys(self.layer))
        roles = [x.role for x in unique]
        if len(roles) != len(set(roles)):
            raise ValueError(f"architecture {self.name}: a role is declared twice")
        object.__setattr__(self, "layer", unique)

    # -- what a layer holds ---------------------------------------------------------------

    @property
    def permuted_qk(self) -> bool:
        """Did llama.cpp's converter permute the q/k rows (undone at load)?"""
        return self.rope == "normal"

    @property
    def activation(self) -> str:
        return MLP_KINDS[self.mlp]

    def roles(self, moe: bool) -> list[LayerTensor]:
        """The tensors of one layer of a dense (moe False) or mixture-of-experts file."""
        drop = DENSE_ROLES if moe else EXPERT_ROLES
        return [x for x in self.layer if x.role not in drop]

    def has(self, role: str) -> bool:
        return any(x.role == role for x in self.layer)

    def windowed(self, layer: int, window: int) -> bool:
        """Does layer `layer` attend only to the last `window` positions (0: no window)?"""
        if window <= 0 or self.swa_pattern is None:
            return False
        n = self.swa_pattern
        return n == 0 or layer % n < n - 1

    def embedding_scale(self, hidden: int) -> float:
        return math.sqrt(hidden) if self.embed_scale == "sqrt_hidden" else 1.0

    def check_experts(self, path: object, moe: bool) -> None:
        if moe and self.experts == "never":
            raise InputError(f"MODEL {path}: {self.name} with experts: strata's engine runs "
                             "experts for the architectures that declare them")
        if not moe and self.experts == "always":
            raise InputError(f"MODEL {path}: {self.name} without {self.name}.expert_count")

    def check_layer(self, path: object, layer: int, names: Iterable[str], moe: bool) -> None:
        """InputError when layer `layer`'s GGUF tensors (suffixes after blk.N.) lack one the
        architecture needs, or hold one it has no place for (another variant)."""
        have = set(names)
        roles = self.roles(moe)
        missing = [x.suffix for x in roles if not x.optional and x.suffix not in have]
        if missing:
            raise InputError(f"MODEL {path}: blk.{layer} has no {missing[0]} (a {self.name} "
                             "layer needs it: an incomplete or different file?)")
        known = {x.suffix for x in roles}
        extra = sorted(have - known)
        if extra:
            raise InputError(f"MODEL {path}: tensor blk.{layer}.{extra[0]} has no place in a "
                             f"{self.name} layer (another variant of the architecture?)")
