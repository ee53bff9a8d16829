"""The trained model as a Hugging Face folder and as a GGUF that llama.cpp runs.

Hugging Face: model.safetensors (the state dict as it is: the model already uses
LlamaForCausalLM's names and layouts; a tied head is left out, transformers re-ties it),
config.json (LlamaConfig) and the tokenizer (tokenizer.json + tokenizer_config.json through
PreTrainedTokenizerFast).

GGUF, written directly with gguf-py's writer (llama.cpp's converter refuses a freshly trained
BPE: it recognises pre-tokenizers by the hash of known ones):
  * architecture `llama`; llama.cpp's llama RoPE rotates adjacent pairs (2i, 2i + 1) where
    transformers rotates halves (i, i + D/2), so the rows of attn_q / attn_k are permuted as
    convert_hf_to_gguf.py's LlamaModel.permute does (attn_k with the KV head count). Skipping
    it still loads and runs, silently worse;
  * tokenizer model `gpt2` with pre-tokenizer `gpt-2` (the same regex split as the trained
    tokenizer's ByteLevel pre-tokenizer), the byte-level token strings, and the merges (which
    must not be empty: the writer drops empty arrays and llama.cpp then cannot load);
    <|endoftext|> is BOS and EOS and is added at the start, as every training document began;
  * a tied head writes no output.weight: llama.cpp then reuses token_embd.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from strata.train.presets import ModelConfig
from strata.train.tokenizer import EOT, eot_id, merges, special_ids, vocab_in_order

if TYPE_CHECKING:
    import tokenizers
    import torch

GGUF_TYPES = ("F32", "F16", "Q8_0")
_FILE_TYPE = {"F32": 0, "F16": 1, "Q8_0": 7}  # llama.cpp's LLAMA_FTYPE_ALL_* / MOSTLY_*
_TOKEN_NORMAL, _TOKEN_CONTROL = 1, 3
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
_BLOCK = {"input_layernorm.weight": "attn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight",
          "self_attn.o_proj.weight": "attn_output.weight",
          "post_attention_layernorm.weight": "ffn_norm.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight"}


def weights(model: torch.nn.Module, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """float32 copies of the weights under transformers' names; a tied head left out."""
    out = {name: t.detach().to("cpu", copy=True).float().contiguous().numpy()
           for name, t in model.state_dict().items()}
    if cfg.tied:
        out.pop("lm_head.weight", None)
    return out


def _check_vocab(cfg: ModelConfig, tok: tokenizers.Tokenizer) -> None:
    if tok.get_vocab_size() != cfg.vocab:
        raise ValueError(f"the tokenizer has {tok.get_vocab_size()} tokens, the model "
                         f"{cfg.vocab}: size the model by the trained tokenizer")


# -- Hugging Face ----------------------------------------------------------------------------


def hf_config(cfg: ModelConfig, tok: tokenizers.Tokenizer) -> Any:
    import transformers

    eot = eot_id(tok)
    return transformers.LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.ctx, rms_norm_eps=cfg.eps, rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tied, attention_bias=False, mlp_bias=False,
        bos_token_id=eot, eos_token_id=eot, torch_dtype="float32")


def export_hf(model: torch.nn.Module, cfg: ModelConfig, tok: tokenizers.Tokenizer,
              out: Path) -> Path:
    """A folder transformers' AutoModelForCausalLM / AutoTokenizer load; returns it."""
    from safetensors.numpy import save_file
    from transformers import PreTrainedTokenizerFast

    _check_vocab(cfg, tok)
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights(model, cfg), str(out / "model.safetensors"), metadata={"format": "pt"})
    hf_config(cfg, tok).save_pretrained(out)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT,
                                   unk_token=None, model_max_length=cfg.ctx)
    fast.save_pretrained(out)
    return out


# -- GGUF ------------------------------------------------------------------------------------


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp converter's permutation of one head group's rows: within each head, the
    half-split pairs (i, i + D/2) become adjacent rows (2i, 2i + 1).
    Inverse: strata.models.gguf_torch.unpermute_rows."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(name: str) -> str:
    if name in _GLOBAL:
        return _GLOBAL[name]
    _, _, layer, rest = name.split(".", 3)  # model.layers.N.<rest>
    return f"blk.{layer}.{_BLOCK[rest]}"


def _tensor(name: str, values: np.ndarray, cfg: ModelConfig, dtype: str,
            permute_qk: bool) -> tuple[np.ndarray, Any]:
    import gguf

    if permute_qk and name.endswith("self_attn.q_proj.weight"):
        values = permute_rows(values, cfg.n_heads)
    elif permute_qk and name.endswith("self_attn.k_proj.weight"):
        values = permute_rows(values, cfg.n_kv_heads)
    # vectors (norms) stay F32, as the converter writes them and as ggml needs them
    qtype = gguf.GGMLQuantizationType[dtype if values.ndim == 2 else "F32"]
    return gguf.quants.quantize(values, qtype), qtype


def _write_metadata(w: Any, cfg: ModelConfig, tok: tokenizers.Tokenizer, dtype: str,
                    name: str) -> None:
    tokens = vocab_in_order(tok)
    control = special_ids(tok)
    eot = eot_id(tok)
    w.add_name(name)
    w.add_context_length(cfg.ctx)
    w.add_embedding_length(cfg.hidden)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.ffn)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.eps)
    w.add_file_type(_FILE_TYPE[dtype])
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([_TOKEN_CONTROL if i in control else _TOKEN_NORMAL
                       for i in range(len(tokens))])
    found = merges(tok)
    if not found:
        raise ValueError("the tokenizer has no merges; llama.cpp cannot load a gpt2 "
                         "tokenizer without them")
    w.add_token_merges(found)
    w.add_bos_token_id(eot)
    w.add_eos_token_id(eot)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def export_gguf(model: torch.nn.Module, cfg: ModelConfig, tok: tokenizers.Tokenizer,
                out: Path, dtype: str = "F32", *, name: str = "strata-trained llama",
                permute_qk: bool = True) -> Path:
    """One GGUF file at `out` (matrices at `dtype`: F32, F16 or Q8_0); returns it.
    permute_qk=False writes the rows unpermuted: wrong for llama.cpp, kept so a test can
    show that the permutation is what makes the logits agree."""
    import gguf

    if dtype not in GGUF_TYPES:
        raise ValueError(f"GGUF type {dtype} is not one of {', '.join(GGUF_TYPES)}")
    _check_vocab(cfg, tok)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), "llama")
    try:
        _write_metadata(w, cfg, tok, dtype, name)
        for hf, values in weights(model, cfg).items():
            data, qtype = _tensor(hf, values, cfg, dtype, permute_qk)
            w.add_tensor(gguf_name(hf), data, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return out
