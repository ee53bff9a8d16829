"""A GGUF's vocabulary through llama.cpp, without its weights: tokenize, detokenize (once or
as a stream), the end-of-generation ids and the chat template. Split from
strata.backends.llamacpp (the backend that loads and times a model), whose process-wide
llama.cpp state (logging, backend init) it shares."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from strata.backends.llamacpp import _LOG, _init_once, lc
from strata.errors import InputError


@contextlib.contextmanager
def _vocab_model(path: Path) -> Iterator[Any]:
    """The GGUF's vocabulary only (no weights) as a llama.cpp model, freed after use; an
    InputError line when llama.cpp cannot load it."""
    _init_once()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    _LOG.errors.clear()
    model = lc.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        why = _LOG.last_error() or "truncated or corrupt?"
        raise InputError(f"{path}: llama.cpp could not load this GGUF's vocabulary ({why})")
    try:
        yield model
    finally:
        lc.llama_model_free(model)


def detokenize_gguf(path: Path, ids: list[int]) -> str:
    """`ids` as text by the GGUF's own vocabulary (special tokens left out), as llama.cpp's
    tools print generated tokens. Loads the vocabulary only."""
    with gguf_decoder(path) as decode:
        return decode(ids)


@contextlib.contextmanager
def gguf_decoder(path: Path) -> Iterator[Any]:
    """A function ids -> text on the GGUF's vocabulary, loaded once for as many calls as a
    stream of tokens needs (detokenize_gguf's arithmetic)."""
    with _vocab_model(path) as model:
        vocab = lc.llama_model_get_vocab(model)

        def decode(ids: list[int]) -> str:
            tokens = (lc.llama_token * max(1, len(ids)))(*ids)
            cap = 16 * len(ids) + 16
            while True:
                buf = ctypes.create_string_buffer(cap)
                n = lc.llama_detokenize(vocab, tokens, len(ids), buf, cap, True, False)
                if n >= 0:
                    return buf.raw[:n].decode("utf-8", errors="replace")
                cap = -n  # too small: llama.cpp says how many bytes it needs
        yield decode


def eog_ids_gguf(path: Path) -> frozenset[int]:
    """The ids that end a generation for this vocabulary (EOS, EOT, <|im_end|>, ...), as
    llama.cpp's llama_vocab_is_eog says."""
    with _vocab_model(path) as model:
        vocab = lc.llama_model_get_vocab(model)
        return frozenset(i for i in range(lc.llama_vocab_n_tokens(vocab))
                         if lc.llama_vocab_is_eog(vocab, i))


def chat_prompt_gguf(path: Path, messages: list[tuple[str, str]]) -> str:
    """`messages` ((role, content) pairs) formatted by the GGUF's own chat template
    (tokenizer.chat_template) through llama.cpp's template engine, ending where the
    assistant's reply begins, as llama-cli's conversation mode formats a turn."""
    with _vocab_model(path) as model:
        tmpl = lc.llama_model_chat_template(model, None)
        if not tmpl:
            raise InputError(f"MODEL {path}: the GGUF has no chat template "
                             "(tokenizer.chat_template); leave out --chat")
        chat = (lc.llama_chat_message * len(messages))(
            *(lc.llama_chat_message(role.encode(), text.encode()) for role, text in messages))
        cap = 2 * sum(len(t.encode()) for _r, t in messages) + 256
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = lc.llama_chat_apply_template(tmpl, chat, len(messages), True, buf, cap)
            if n < 0:
                raise InputError(f"MODEL {path}: llama.cpp does not know this GGUF's chat "
                                 "template; leave out --chat and format the prompt yourself")
            if n <= cap:
                return buf.raw[:n].decode("utf-8", errors="replace")
            cap = n


def tokenize_gguf(path: Path, text: str, special: bool = False
                  ) -> tuple[list[int], int | None]:
    """`text` as token ids by the GGUF's own tokenizer, no special tokens added (`special`:
    the ones written in the text parsed, as a chat template's), and the BOS id llama.cpp
    puts first for this vocabulary (None when it adds none).

    Loads the vocabulary only (no weights), so a long text is checked in seconds.
    """
    with _vocab_model(path) as model:
        vocab = lc.llama_model_get_vocab(model)
        data = text.encode("utf-8")
        cap = len(data) + 16  # a token covers at least one byte, except special ones
        while True:
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(vocab, data, len(data), buf, cap, False, special)
            if n >= 0:
                break
            cap = -n  # too small: llama.cpp says how many it needs
        ids = np.ctypeslib.as_array(buf)[:n].tolist()
        bos = lc.llama_vocab_bos(vocab) if lc.llama_vocab_get_add_bos(vocab) else -1
        return ids, (bos if bos >= 0 else None)
