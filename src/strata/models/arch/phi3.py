"""phi3: Phi-3 / Phi-3.5 — q, k and v in one fused matrix (attn_qkv: rows q, then k, then v),
the MLP's gate and up in one (ffn_up: the first half of its rows the gate), NeoX RoPE with
LongRoPE factors where the file has them (rope_factors_long/short: the long ones when the
context exceeds the original one, as llama.cpp picks them, and every cos/sin scaled by
{arch}.rope.scaling.attn_factor). llama.cpp runs Phi-3 without a sliding window, whatever
the file says, and so does strata.
"""

from strata.models.arch import register
from strata.models.arch.spec import FUSED_ATTENTION, FUSED_MLP, Arch

ARCH = register(Arch("phi3", (*FUSED_ATTENTION, *FUSED_MLP), rope="neox", model_type="phi3",
                     transformers_names={"attn_qkv.weight": "self_attn.qkv_proj.weight",
                                         "ffn_up.weight": "mlp.gate_up_proj.weight"}))
