"""llama: Llama 1 to 3, Mistral, TinyLlama, SmolLM, Mixtral (experts). llama.cpp's converter
permutes the q/k rows for its adjacent-pair RoPE; biases where a fine-tune added them."""

from strata.models.arch import register
from strata.models.arch.spec import ATTENTION, DENSE_MLP, EXPERTS, QKV_BIASES, Arch

ARCH = register(Arch("llama", (*ATTENTION, *QKV_BIASES, *DENSE_MLP, *EXPERTS),
                     rope="normal", experts="optional", model_type="llama"))
