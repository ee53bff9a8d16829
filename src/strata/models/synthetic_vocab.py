"""The synthetic models' vocabulary: one character per token, so text round-trips exactly
through llama.cpp's tokenizer (and the torch side's)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from strata.errors import InputError

N_BYTE_TOKENS = 256


FIRST_TEXT_ID = 3 + N_BYTE_TOKENS  # first id that is a plain character


_FIRST_CODE_POINT = 0x4E00  # CJK: one code point per token, nothing llama.cpp treats as space


_TOKEN_TYPE = {"normal": 1, "unknown": 2, "control": 3, "byte": 6}  # llama.cpp token types


@lru_cache(maxsize=1)
def _code_points() -> np.ndarray:
    """Every code point a text token may use, in id order.

    Skips surrogates (not encodable in UTF-8) and Unicode noncharacters (U+FDD0..U+FDEF,
    U+xxFFFE/U+xxFFFF), which some HTTP/JSON stacks reject or replace.
    """
    cps = np.arange(_FIRST_CODE_POINT, 0x110000, dtype=np.int64)
    keep = ~((cps >= 0xD800) & (cps <= 0xDFFF))
    keep &= ~((cps >= 0xFDD0) & (cps <= 0xFDEF))
    keep &= (cps & 0xFFFE) != 0xFFFE
    return cps[keep]


def text_token_capacity() -> int:
    """Largest vocabulary the synthetic tokenizer can express."""
    return FIRST_TEXT_ID + len(_code_points())


def text_for_tokens(ids: Iterable[int]) -> str:
    """The text that a synthetic model's tokenizer turns into exactly `ids` (after BOS).

    Every id must be a plain-text id (>= FIRST_TEXT_ID and below the model's vocab).
    """
    cps = _code_points()
    out = []
    for i in ids:
        if not FIRST_TEXT_ID <= i < FIRST_TEXT_ID + len(cps):
            raise ValueError(f"token id {i} is not a synthetic text token "
                             f"(ids {FIRST_TEXT_ID}..vocab-1 are)")
        out.append(chr(int(cps[i - FIRST_TEXT_ID])))
    return "".join(out)


def text_id_range(vocab: int) -> range:
    """Ids a benchmark may draw for a synthetic model of `vocab` tokens when the prompt must
    travel as text (every one is a single character)."""
    return range(FIRST_TEXT_ID, vocab)


def tokens_for_text(text: str) -> list[int]:
    """Inverse of text_for_tokens: one id per character (ValueError for any other text)."""
    cps = _code_points()
    ids = []
    for ch in text:
        pos = int(np.searchsorted(cps, ord(ch)))
        if pos >= len(cps) or cps[pos] != ord(ch):
            raise ValueError(f"character {ch!r} (U+{ord(ch):04X}) is not a synthetic text token")
        ids.append(FIRST_TEXT_ID + pos)
    return ids


# control tokens llama.cpp's vocabulary loader looks up by text for an architecture (its
# Phi-3 vocabulary needs <|endoftext|>): they take the last ids of that vocabulary
ARCH_SPECIALS: dict[str, tuple[str, ...]] = {"phi3": ("<|endoftext|>",)}


def vocab_tokens(vocab: int, arch: str | None = None) -> tuple[list[str], list[int], list[float]]:
    """(token texts, llama.cpp token types, scores) of a synthetic vocabulary of `vocab`
    (`arch`'s control tokens, if it has any, in its last ids)."""
    if not FIRST_TEXT_ID < vocab <= text_token_capacity():
        raise InputError(f"synthetic vocab of {vocab}: must be in {FIRST_TEXT_ID + 1}.."
                         f"{text_token_capacity()}")
    texts = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(N_BYTE_TOKENS))]
    types = [_TOKEN_TYPE["unknown"], _TOKEN_TYPE["control"], _TOKEN_TYPE["control"]]
    types += [_TOKEN_TYPE["byte"]] * N_BYTE_TOKENS
    texts += [chr(int(c)) for c in _code_points()[: vocab - FIRST_TEXT_ID]]
    types += [_TOKEN_TYPE["normal"]] * (vocab - FIRST_TEXT_ID)
    for j, special in enumerate(ARCH_SPECIALS.get(arch or "", ())):
        texts[vocab - 1 - j], types[vocab - 1 - j] = special, _TOKEN_TYPE["control"]
    scores = [-float(i) for i in range(vocab)]
    return texts, types, scores
