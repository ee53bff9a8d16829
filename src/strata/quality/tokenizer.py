"""Text -> token ids by the model's own tokenizer, chosen through a registry of schemes.

  synthetic  strata's synthetic models (random weights) have a vocabulary of single CJK
             characters that English text never uses; the text is mapped deterministically
             into the model's plain-text ids instead: id = FIRST_TEXT_ID + (code point mod
             the number of text ids). Perplexity then measures the model on that token
             stream, which is what a speed-model's quality figures need to be comparable.
  gguf       llama.cpp's tokenizer of the GGUF (vocabulary-only load, no weights)
  hf         the tokenizer files of a Hugging Face directory (transformers' AutoTokenizer)

Every backend scores the same ids: tokenisation happens once, here, not in each backend.
As llama.cpp's perplexity tool (common_tokenize(ctx, text, add_special=true)), the ids start
with BOS when the vocabulary asks for one (llama_vocab_get_add_bos): the first chunk then
holds BOS and the first text tokens at the positions llama-perplexity gives them.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from strata.errors import InputError
from strata.models.source import ResolvedModel

# A Hugging Face directory holds at least one of these when it carries a tokenizer.
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
Decode = Callable[[list[int]], str]
GGUF_SYNTHETIC_KEY = "strata.synthetic"  # written by strata's synthetic GGUF writer
HF_SYNTHETIC_KEY = "strata_synthetic"  # ... and into the synthetic config.json


@dataclass(frozen=True)
class Tokens:
    """A text as token ids of one vocabulary: BOS first when the model adds one, no other
    special tokens (what llama-perplexity tokenises)."""

    ids: np.ndarray  # int64
    bos: int | None  # what the model expects first in a context (None: nothing)
    scheme: str  # how the ids were made, in words (stored with every result)

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def of_text(cls, ids: np.ndarray | list[int], bos: int | None, scheme: str) -> Tokens:
        """The text's ids (no special tokens) with BOS put first when there is one."""
        body = np.asarray(ids, dtype=np.int64)
        if bos is not None:
            body = np.concatenate([np.array([bos], dtype=np.int64), body])
        return cls(body, bos, scheme)


# -- synthetic ---------------------------------------------------------------------------


def _gguf_path(model: ResolvedModel) -> Path | None:
    art = model.artefacts.get("gguf")
    return art if isinstance(art, Path) else None


def _hf_dir(model: ResolvedModel) -> Path | None:
    art = model.artefacts.get("hf")
    return art if isinstance(art, Path) else None


def is_synthetic(model: ResolvedModel) -> bool:
    """A strata synthetic model, by name or by the marker its files carry (a re-quantised
    synthetic GGUF passed as a path keeps the marker, so it tokenises like its source)."""
    if model.kind == "synthetic":
        return True
    gguf, hf = _gguf_path(model), _hf_dir(model)
    if gguf is not None:
        from strata.models.gguf import scan_or_input_error

        return GGUF_SYNTHETIC_KEY in scan_or_input_error(gguf)[0].kv
    if hf is not None:
        from strata.models.hf import read_config

        return HF_SYNTHETIC_KEY in read_config(hf).values
    return False


def synthetic_ids(text: str, vocab: int) -> np.ndarray:
    from strata.models.synthetic import FIRST_TEXT_ID

    n_text = vocab - FIRST_TEXT_ID
    if n_text < 1:
        raise InputError(f"synthetic vocab of {vocab} has no plain-text ids")
    cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    return FIRST_TEXT_ID + cps % n_text


def _synthetic_text(model: ResolvedModel, ids: list[int]) -> str:
    """The inverse of synthetic_ids on the plain-text ids (code points below the model's
    text range; special ids print nothing, a surrogate code point as U+FFFD)."""
    from strata.models.synthetic import FIRST_TEXT_ID

    cps = (i - FIRST_TEXT_ID for i in ids if i >= FIRST_TEXT_ID)
    return "".join("\ufffd" if 0xD800 <= cp <= 0xDFFF else chr(cp) for cp in cps)


def _synthetic(model: ResolvedModel, text: str) -> Tokens:
    from strata.models.synthetic import BOS_ID, FIRST_TEXT_ID

    vocab = _vocab(model)
    scheme = (f"synthetic: one token per character, id = {FIRST_TEXT_ID} + code point mod "
              f"{vocab - FIRST_TEXT_ID} (the model's plain-text ids)")
    return Tokens.of_text(synthetic_ids(text, vocab), BOS_ID, scheme)


def _vocab(model: ResolvedModel) -> int:
    if model.spec is None:
        raise InputError(f"MODEL {model.ref}: no vocabulary size known")
    return model.spec.vocab


# -- GGUF (llama.cpp) --------------------------------------------------------------------


def _gguf(model: ResolvedModel, text: str) -> Tokens:
    path = model.path("gguf", "llamacpp")
    try:
        from strata.backends.llamacpp_vocab import tokenize_gguf
    except Exception as exc:  # BackendUnavailable: llama-cpp-python missing
        raise InputError(f"MODEL {model.ref}: tokenising a GGUF needs llama.cpp ({exc})") from None
    ids, bos = tokenize_gguf(path, text)
    return Tokens.of_text(ids, bos, f"llama.cpp tokenizer of {path.name}")


@contextlib.contextmanager
def _gguf_decoder(model: ResolvedModel) -> Iterator[Decode]:
    from strata.backends.llamacpp_vocab import gguf_decoder

    with gguf_decoder(model.path("gguf", "llamacpp")) as decode:
        yield decode


# -- Hugging Face ------------------------------------------------------------------------


def _hf(model: ResolvedModel, text: str) -> Tokens:
    folder = model.path("hf", "torch")
    if not any((folder / name).is_file() for name in HF_TOKENIZER_FILES):
        raise InputError(f"MODEL {model.ref}: {folder} has no tokenizer files "
                         f"({', '.join(HF_TOKENIZER_FILES)}); copy them from the model's repo")
    tok = _auto_tokenizer(model, folder)
    with contextlib.redirect_stderr(io.StringIO()):  # "sequence longer than max length"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with_special = tok("a")["input_ids"]
    bos = tok.bos_token_id
    adds_bos = bos is not None and with_special[:1] == [bos]  # what the tokenizer itself does
    return Tokens.of_text(ids, bos if adds_bos else None,
                          f"transformers tokenizer of {folder.name} ({type(tok).__name__})")


@contextlib.contextmanager
def _hf_decoder(model: ResolvedModel) -> Iterator[Decode]:
    tok = _auto_tokenizer(model, model.path("hf", "torch"))
    yield lambda ids: str(tok.decode(ids, skip_special_tokens=True))


def _auto_tokenizer(model: ResolvedModel, folder: Path):  # -> transformers tokenizer
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError) as exc:
        line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(f"MODEL {model.ref}: transformers cannot load the tokenizer in "
                         f"{folder}: {line}") from None


# -- registry ----------------------------------------------------------------------------


@contextlib.contextmanager
def _synthetic_decoder(model: ResolvedModel) -> Iterator[Decode]:
    yield lambda ids: _synthetic_text(model, ids)


@dataclass(frozen=True)
class Scheme:
    name: str
    applies: Callable[[ResolvedModel], bool]
    tokenize: Callable[[ResolvedModel, str], Tokens]
    # ids -> text, its vocabulary loaded once for every call made inside the `with`
    decoder: Callable[[ResolvedModel], contextlib.AbstractContextManager[Decode]]


# First scheme that applies wins: synthetic before the file formats it also has.
SCHEMES: list[Scheme] = [
    Scheme("synthetic", is_synthetic, _synthetic, _synthetic_decoder),
    Scheme("gguf", lambda m: "gguf" in m.artefacts, _gguf, _gguf_decoder),
    Scheme("hf", lambda m: "hf" in m.artefacts, _hf, _hf_decoder),
]


def chat_tokens(model: ResolvedModel, text: str | list[tuple[str, str]]) -> Tokens:
    """`text` as one user turn (or a conversation of (role, content) turns) formatted by the
    model's chat template (a GGUF's, through llama.cpp), the reply's start included,
    tokenised with the template's special tokens parsed."""
    if "gguf" not in model.artefacts and model.kind != "synthetic":
        raise InputError(f"MODEL {model.ref}: --chat needs a GGUF with a chat template "
                         "(tokenizer.chat_template)")
    from strata.backends.llamacpp_vocab import chat_prompt_gguf, tokenize_gguf

    path = model.path("gguf", "llamacpp")
    turns = [("user", text)] if isinstance(text, str) else text
    formatted = chat_prompt_gguf(path, turns)
    ids, bos = tokenize_gguf(path, formatted, special=True)
    if bos is not None and ids[:1] == [bos]:  # the template wrote BOS itself
        bos = None
    return Tokens.of_text(ids, bos, f"chat template of {path.name} (llama.cpp), then its "
                                    "tokenizer with special tokens parsed")


def decoder(model: ResolvedModel) -> contextlib.AbstractContextManager[Decode]:
    """ids -> text by the same scheme `tokenize` reads the model's text with, its vocabulary
    loaded once for the `with` block (a stream decodes after every token)."""
    for scheme in SCHEMES:
        if scheme.applies(model):
            return scheme.decoder(model)
    raise InputError(f"MODEL {model.ref}: no tokenizer to turn its tokens into text")


def detokenize(model: ResolvedModel, ids: list[int]) -> str:
    """Generated `ids` as text, by the same scheme `tokenize` reads the model's text with."""
    with decoder(model) as decode:
        return decode(ids)


def end_ids(model: ResolvedModel) -> frozenset[int]:
    """The ids that end a generation (llama.cpp's end-of-generation set for a GGUF; EOS for
    strata's synthetic vocabulary and a Hugging Face config's eos_token_id)."""
    if is_synthetic(model):
        from strata.models.synthetic import EOS_ID

        return frozenset({EOS_ID})
    if "gguf" in model.artefacts:
        from strata.backends.llamacpp_vocab import eog_ids_gguf

        return eog_ids_gguf(model.path("gguf", "llamacpp"))
    tok = _auto_tokenizer(model, model.path("hf", "torch"))
    return frozenset({tok.eos_token_id} if tok.eos_token_id is not None else ())


@dataclass
class TextStream:
    """Generated tokens as text while they come: each push gives the text the new token
    completes (nothing while a UTF-8 character is still cut, as llama-cli holds it)."""

    decode: Decode
    ids: list[int] = field(default_factory=list)
    shown: int = 0  # characters given out so far

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character not complete yet
            return ""
        piece, self.shown = text[self.shown:], len(text)
        return piece


def tokenize(model: ResolvedModel, text: str) -> Tokens:
    for scheme in SCHEMES:
        if scheme.applies(model):
            return scheme.tokenize(model, text)
    raise InputError(f"MODEL {model.ref}: strata quality needs a GGUF, a Hugging Face "
                     "directory or a synthetic model (an endpoint returns no logits)")
