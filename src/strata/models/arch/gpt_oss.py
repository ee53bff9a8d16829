"""gpt-oss: OpenAI's open-weight mixture of experts (gpt-oss-20b, gpt-oss-120b), as
llama.cpp's llm_build_openai_moe_iswa runs it.

Attention: q/k/v and the output projection carry biases; NeoX RoPE with YaRN scaling (the
file's rope.scaling keys: factor 32 over an original 4 096-position context); a learned sink
logit per query head joins every softmax's denominator (`sinks`, attention_sinks op); every
other layer, from layer 0, attends to the last `gpt-oss.attention.sliding_window` (128)
positions only (llama.cpp's set_swa_pattern(2)), with the same RoPE as the global layers.
The MLP is routed experts only: the router (with a bias) picks the top k of its logits and
softmaxes those k (gating "softmax_weight"); each expert's gate and up projections (biased)
meet in the clamped SwiGLU x·sigmoid(1.702x)·(y + 1), x = min(gate, 7), y = clamp(up, ±7), then a
biased down projection. The norm before the experts is stored as post_attention_norm. The
published GGUFs store the experts as MXFP4 (the checkpoint's own format).

transformers' GptOss checkpoint fuses each layer's experts: gate_up_proj [E, hidden, 2·ffn]
holds gate in the even and up in the odd columns (x @ W, not W @ x), down_proj
[E, ffn, hidden], each with an [E, N] bias (strata.models.synthetic_moe.fused_gate_up).
"""

from strata.models.arch import register
from strata.models.arch.spec import (
    ATTENTION,
    EXPERT_BIASES,
    EXPERTS,
    O_BIAS,
    QKV_BIASES,
    SINKS,
    Arch,
    t,
)

_NORM = t("ffn_norm", "post_attention_norm.weight")
_EXPERTS = tuple(x if x.role != "ffn_norm" else _NORM for x in EXPERTS)

ARCH = register(Arch(
    "gpt-oss", (*ATTENTION, *QKV_BIASES, *O_BIAS, *SINKS, *_EXPERTS, *EXPERT_BIASES),
    rope="neox", mlp="swiglu_oai", experts="always", gating="softmax_weight", swa_pattern=2,
    expert_storage="MXFP4", model_type="gpt_oss", transformers_experts="fused_gate_up",
    # transformers' GptOss names (modeling_gpt_oss.py): the router is mlp.router, the
    # experts' fused tensors and their biases are parameters of mlp.experts
    transformers_names={
        "attn_sinks.weight": "self_attn.sinks",
        "attn_output.bias": "self_attn.o_proj.bias",
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "ffn_gate_inp.weight": "mlp.router.weight",
        "ffn_gate_inp.bias": "mlp.router.bias",
        "ffn_gate_up_exps.weight": "mlp.experts.gate_up_proj",
        "ffn_gate_up_exps.bias": "mlp.experts.gate_up_proj_bias",
        "ffn_down_exps.weight": "mlp.experts.down_proj",
        "ffn_down_exps.bias": "mlp.experts.down_proj_bias"}))
