"""gemma3: Gemma 3 (text) — the embedding scaled by √hidden, q/k heads RMS-normed, NeoX RoPE,
norms after attention and after the MLP as well as before, a tanh-GELU gated MLP, a tied head.

Five layers in six attend to the last `gemma3.attention.sliding_window` positions only
(llama.cpp's set_swa_pattern(6)), with RoPE base 10 000; every sixth attends to everything
with the file's base (and its RoPE scaling, where the file sets one). llama.cpp's converter
adds 1 to every Gemma norm weight (Gemma multiplies by 1 + w), so a GGUF's norms are plain
RMS-norm weights, like every other architecture's (the transformers loader takes the 1
off again: norm_offset).
transformers' Gemma scales queries by query_pre_attn_scalar^-1/2, which is the head size for
every Gemma 3 but the 27B (whose llama.cpp scale is hidden/heads): the loader sets it so.
"""

from strata.models.arch import register
from strata.models.arch.spec import ATTENTION, DENSE_MLP, POST_NORMS, QK_NORMS, Arch

ARCH = register(Arch(
    "gemma3", (*ATTENTION, *QK_NORMS, *POST_NORMS, *DENSE_MLP), rope="neox", mlp="geglu",
    embed_scale="sqrt_hidden", swa_pattern=6, swa_rope_base=10000.0,
    model_type="gemma3_text", norm_offset=1.0,
    transformers_extra={"hidden_activation": "gelu_pytorch_tanh",
                        "rope_local_base_freq": 10000.0},
    transformers_names={"ffn_norm.weight": "pre_feedforward_layernorm.weight",
                        "post_attention_norm.weight": "post_attention_layernorm.weight",
                        "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}))
