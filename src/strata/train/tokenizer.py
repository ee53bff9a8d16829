"""A byte-level BPE trained at run time with the `tokenizers` library, GPT-2 style: the
GPT-2 pre-tokenizer regex (what llama.cpp's `gpt-2` pre-tokenizer splits the same way), the
256 byte symbols always in the vocabulary (any text encodes, nothing is unknown), and one
special token, <|endoftext|> (id 0), that starts every document: it is the model's BOS and
EOS.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from strata.errors import InputError

if TYPE_CHECKING:
    import tokenizers

    from strata.train.data import Document

EOT = "<|endoftext|>"
MIN_VOCAB = 257  # the 256 byte symbols and EOT


def train_tokenizer(docs: Iterable[Document], vocab: int) -> tokenizers.Tokenizer:
    """Train on the documents' text; the result has exactly `vocab` tokens unless the text
    has fewer distinct pairs to merge (then fewer: size the model by get_vocab_size())."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab < MIN_VOCAB:
        raise InputError(f"a byte-level BPE needs at least {MIN_VOCAB} tokens, not {vocab}")
    tok = Tokenizer(models.BPE())
    # use_regex: GPT-2's split; add_prefix_space off, or " x" and "x" would encode alike
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, special_tokens=[EOT], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((d.text for d in docs), trainer=trainer)
    return tok


def eot_id(tok: tokenizers.Tokenizer) -> int:
    found = tok.token_to_id(EOT)
    if found is None:
        raise InputError(f"the tokenizer has no {EOT} token: not one strata trained")
    return int(found)


def save_tokenizer(tok: tokenizers.Tokenizer, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def load_tokenizer(path: Path) -> tokenizers.Tokenizer:
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises bare Exceptions for bad JSON
        raise InputError(f"{path}: not a tokenizer.json ({str(exc).splitlines()[0]})") from None
    eot_id(tok)
    return tok


def vocab_in_order(tok: tokenizers.Tokenizer) -> list[str]:
    """Token strings by id (byte-level symbols, as GGUF's token list stores them)."""
    by_id = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError("the tokenizer's ids are not contiguous from 0")
    return [by_id[i] for i in range(len(by_id))]


def merges(tok: tokenizers.Tokenizer) -> list[str]:
    """The BPE merges in rank order as "left right" (llama.cpp's and GPT-2's format); the
    tokenizer JSON holds them as pairs or as such strings depending on its version."""
    model = json.loads(tok.to_str())["model"]
    return [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]


def special_ids(tok: tokenizers.Tokenizer) -> set[int]:
    return {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
