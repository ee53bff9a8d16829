"""Prompt text of N tokens for the openai backend, and how its tokens are counted.

A server takes text, not ids, so a random prompt of N tokens needs some tokenizer. One class
per way of knowing the tokens; the backend takes the first that applies
(openai.py: OpenAIBackend._prompt_text):

  SyntheticText   a strata synthetic model: one character per token, exact both ways (the
                  streamed text counts the generated tokens too);
  ServerText      the server's own tokenize route (llama.cpp's /tokenize, llama-cpp-python's
                  /extras/tokenize): random words cut where the server counts exactly N;
  LocalText       no such route, but the served model's GGUF is on this machine (an
                  `ollama:NAME` ref): its tokenizer, through llama.cpp, cuts random words to
                  N - k tokens, k being what the server adds to every prompt (BOS, a chat
                  template), measured by two untimed probe requests;
  CalibratedText  nothing known: untimed probe requests fit the server's usage.prompt_tokens
                  as k + b·words + a·letters over random common words, prompts are built to N
                  by that fit, and every timed reply's count corrects it.

The last two are counted by the server: they have no ids the client knows, so random_ids
returns a handle (N copies of one negative number) that only text() reads back, and the
backend takes each timed prompt's length from the server's usage where it is sent. Their
probes never send a timed prompt's text, so no prompt cache can serve a timed request.
Generated tokens are counted from the streamed text where the vocabulary allows
(synthetic), else one per streamed delta, checked against usage.completion_tokens.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from itertools import combinations_with_replacement
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from strata.backends.openai_protocol import (
    EOS_BIAS,
    Server,
    _field,
    _json_object,
    _server_message,
    _token_ids,
)
from strata.errors import InputError, StrataError

DELTA_COUNT = ("one token per streamed delta, checked against the server's "
               "usage.completion_tokens")
Probe = Callable[[str], int]  # prompt text -> the server's usage.prompt_tokens for it


class PromptText:
    """Turns token ids into prompt text and counts the tokens in streamed text."""

    kind = ""  # how prompt tokens are counted (info: prompt_tokens_from)
    generated = DELTA_COUNT  # how generated tokens are counted (info: generated_tokens_from)
    counts_text = False  # count() reads streamed text; else one token per delta
    server_counted = False  # the server's usage is the prompt's length (not known exactly)
    bos: int | None = None
    eos: int | None = None

    def random_ids(self, n: int, seed: int) -> list[int]:
        raise NotImplementedError

    def text(self, ids: list[int]) -> str:
        raise NotImplementedError

    def count(self, text: str) -> int | None:
        """Tokens in a streamed chunk's text; None when the text alone cannot say."""
        return None

    def logit_bias(self) -> dict[str, float]:
        return {str(self.eos): EOS_BIAS} if self.eos is not None else {}

    def empty_prompt(self, rng: random.Random) -> str:
        """The text sent for a prompt of no tokens (tg: BOS only)."""
        return ""

    def observed(self, ids: tuple[int, ...], reported: int) -> None:
        """The server counted `reported` tokens for the prompt `ids` (a timed request)."""

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class SyntheticText(PromptText):
    """The synthetic vocabulary: one character per text token, nothing else in text."""

    kind = "synthetic vocabulary (one character per token)"
    generated = "the streamed text (synthetic vocabulary: one character per token)"
    counts_text = True

    def __init__(self, vocab: int) -> None:
        from strata.models import synthetic

        self._syn = synthetic
        self.vocab = vocab
        self.bos, self.eos = synthetic.BOS_ID, synthetic.EOS_ID

    def random_ids(self, n: int, seed: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.randrange(self._syn.FIRST_TEXT_ID, self.vocab) for _ in range(n)]

    def text(self, ids: list[int]) -> str:
        try:
            return self._syn.text_for_tokens(ids)
        except ValueError as exc:
            raise InputError(f"openai: {exc}") from exc

    def count(self, text: str) -> int | None:
        try:
            return len(self._syn.tokens_for_text(text))
        except ValueError:
            return None

    def logit_bias(self) -> dict[str, float]:
        # Every id that is not one plain character: EOS (never stop early) and unk, BOS and
        # the byte tokens (their text is not one character each, which would break counts).
        return {str(i): EOS_BIAS for i in range(self._syn.FIRST_TEXT_ID)}


def fit_prefix(text: str, n: int, count: Callable[[str], int]) -> str | None:
    """The shortest prefix of `text` that `count` says is exactly n tokens.

    Cutting text (not ids) never splits a character, whatever the vocabulary; the token
    count grows with the prefix length, so a binary search finds the cut.
    """
    lo, hi = 0, len(text)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count(text[:mid]) >= n:
            hi = mid
        else:
            lo = mid
    for cut in range(hi, min(hi + 4, len(text)) + 1):  # counts can wobble at merges
        if count(text[:cut]) == n:
            return text[:cut]
    return None


def _word(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8)))


def _random_words(rng: random.Random, n: int) -> str:
    return " ".join(_word(rng) for _ in range(n))


class ServerText(PromptText):
    """The server's tokenizer: random words, cut where the server counts exactly N tokens."""

    kind = "server tokenizer (random words cut to exactly N tokens by the server)"

    def __init__(self, client: httpx.Client, server: Server) -> None:
        self._client, self._server = client, server
        self._texts: dict[tuple[int, ...], str] = {}
        with_special = self._tokenize("", special=True)
        self.bos = with_special[0] if with_special else None

    def _post(self, path: str, body: dict[str, Any], key: str) -> Any:
        """POST to a tokenizer route and return field `key` of its JSON reply."""
        url = self._server.root + path
        resp = self._client.post(url, json=body)
        if resp.status_code >= 400:
            raise StrataError(f"{url}: HTTP {resp.status_code}: {_server_message(resp)}")
        return _field(url, _json_object(url, resp), key)

    def _tokenize(self, text: str, special: bool = False) -> list[int]:
        if self._server.flavour == "llama.cpp":
            path, body = "/tokenize", {"content": text, "add_special": special}
        else:
            path, body = "/extras/tokenize", {"input": text, "model": self._server.model}
        ids = _token_ids(self._server.root + path, self._post(path, body, "tokens"))
        # llama-cpp-python always adds BOS: strip it when not wanted
        if self._server.flavour != "llama.cpp" and not special and ids and ids[0] == self.bos:
            ids = ids[1:]
        return ids

    def _detokenize(self, ids: list[int]) -> str:
        if self._server.flavour == "llama.cpp":
            return str(self._post("/detokenize", {"tokens": ids}, "content"))
        body = {"tokens": ids, "model": self._server.model}
        return str(self._post("/extras/detokenize", body, "text"))

    def random_ids(self, n: int, seed: int) -> list[int]:
        if n == 0:
            return []
        for attempt in range(4):
            rng = random.Random(seed * 16 + attempt)
            # n + 8 words: at least n + 8 tokens, since every word is at least one token
            cut = fit_prefix(_random_words(rng, n + 8), n, lambda t: len(self._tokenize(t)))
            if cut is not None:
                ids = self._tokenize(cut)
                self._texts[tuple(ids)] = cut  # run() sends exactly this text
                return ids
        raise StrataError(f"{self._server.root}: could not build a prompt of exactly {n} "
                          "tokens with the server's tokenizer")

    def text(self, ids: list[int]) -> str:
        return self._texts.get(tuple(ids)) or self._detokenize(ids)


# -- counted by the server -------------------------------------------------------------------

# Common English words: single tokens (with their leading space) in the vocabularies of
# most released models, so a prompt of them is counted the same by most tokenizers; lengths
# 2..7 letters so that a probe can tell a per-word cost from a per-letter one.
_COMMON = """
of to in is it on as at by be or an we he if my up so no do go me us am
the and for are was not you but all can had her one our out day get has him his how man
new now old see two way who boy did its let put say she too use any big far few got off
own run set end why ask men
that with have this will your from they been call when make like time long look more than
them some what were said each many then into over only year also back come made most must
name just good very form much give tell line well last same four five
there which their would other about write could these first water sound place where after
think great again still every never under while right small large often house point world
three years
people number little should always before around follow change answer school father mother
really second enough public system family
between example without against another because however nothing thought through already
general support several history company country program problem
"""
COMMON_WORDS = tuple(_COMMON.split())
_BY_LENGTH: dict[int, tuple[str, ...]] = {
    n: tuple(w for w in COMMON_WORDS if len(w) == n)
    for n in sorted({len(w) for w in COMMON_WORDS})}
# Probe prompts: (words, allowed lengths). Short and long words at two counts, so words and
# letters vary independently; four probes for three unknowns leave one to check the fit.
PROBES: tuple[tuple[int, tuple[int, ...]], ...] = (
    (8, (2, 3)), (8, (6, 7)), (24, (2, 3)), (24, (6, 7)))


def _words_text(words: list[str]) -> str:
    """Every word with its leading space, the first too: each word is then the same unit
    wherever it stands (a tokenizer counts " the" and "the" differently)."""
    return "".join(" " + w for w in words)


class _CountedByServer(PromptText):
    server_counted = True

    def __init__(self, probe: Probe) -> None:
        self._probe = probe
        self._texts: dict[tuple[int, ...], str] = {}
        # prompt -> (tokens asked for, tokens its text should be by what is known)
        self._built: dict[tuple[int, ...], tuple[int, float]] = {}
        self._seen: list[tuple[float, int]] = []  # (expected, the server's count), timed
        self._misses: list[int] = []  # the server's count - the tokens asked for
        self._handles = 0
        self.overhead: float | None = None  # tokens the server adds to every prompt
        self.probes = 0

    def calibrate(self) -> bool:
        """Measure what is needed (untimed probe requests); False: cannot be used here."""
        raise NotImplementedError

    def _build(self, n: int, seed: int) -> tuple[str, float]:
        """Text of n tokens by the server's count, and the count expected for it."""
        raise NotImplementedError

    @property
    def scale(self) -> float:
        """The server's counts over the expected ones, beyond the tokens it adds to every
        prompt, pooled over the timed prompts so far (the warm-up's included): a fit of short
        probes is off in proportion to the length, so the next prompts' text is scaled by
        the inverse where it is estimated. 1.0 while the fit holds."""
        o = self.overhead or 0.0
        expected = sum(e - o for e, _ in self._seen)
        got = sum(r - o for _, r in self._seen)
        return got / expected if expected > 0 and got > 0 else 1.0

    def random_ids(self, n: int, seed: int) -> list[int]:
        if n == 0:
            return []
        if self.overhead is None and not self.calibrate():
            raise StrataError("openai: prompt calibration failed")
        assert self.overhead is not None
        if n <= self.overhead:
            raise InputError(f"-p/-d {n}: the server counts {self.overhead:g} tokens of its "
                             "own in every prompt (BOS, a chat template), so a prompt of "
                             f"{n} tokens cannot be built; ask for more than "
                             f"{self.overhead:g}")
        self._handles += 1
        key = (-self._handles,) * n
        self._texts[key], expected = self._build(n, seed)
        self._built[key] = (n, expected)
        return list(key)

    def text(self, ids: list[int]) -> str:
        try:
            return self._texts[tuple(ids)]
        except KeyError:
            raise StrataError("openai: these prompt ids were not made by this backend "
                              "(a server-counted prompt has no ids of its own)") from None

    def observed(self, ids: tuple[int, ...], reported: int) -> None:
        built = self._built.pop(tuple(ids), None)
        self._texts.pop(tuple(ids), None)
        if built is not None:
            asked, expected = built
            self._seen.append((expected, reported))
            self._misses.append(reported - asked)

    def _checked(self) -> dict[str, Any]:
        misses = [abs(m) for m in self._misses]
        return {"timed_prompts_checked": len(misses),
                "timed_prompts_exact": sum(1 for m in misses if m == 0),
                "max_miss_tokens": max(misses, default=None)}

    def empty_prompt(self, rng: random.Random) -> str:
        # An empty prompt is no request to some servers (Ollama answers it by loading the
        # model and generating nothing), so a tg request sends one word.
        return rng.choice(_BY_LENGTH[min(_BY_LENGTH)])


class LocalText(_CountedByServer):
    """The served model's own tokenizer, here: random words cut to exactly N - k tokens."""

    def __init__(self, probe: Probe, vocab: GgufVocab, label: str) -> None:
        super().__init__(probe)
        self._vocab = vocab
        self.bos, self.eos, self.eot = None, vocab.eos, vocab.eot
        self.label = label
        self.kind = (f"local tokenizer ({label}): random words cut to N - k tokens, k = "
                     "what the server adds to every prompt (2 probe requests)")
        self.disagreement = ""

    def calibrate(self) -> bool:
        rng = random.Random(0x0CA1)
        extra: set[int] = set()
        for n_words in (8, 24):
            text = _random_words(rng, n_words)
            extra.add(self._probe(text) - self._vocab.count(text))
            self.probes += 1
        if len(extra) != 1:
            self.disagreement = (f"the server's prompt counts do not match {self.label}'s "
                                 f"tokenizer (it adds {sorted(extra)} tokens to two probes)")
            return False
        self.overhead = float(extra.pop())
        return True

    def _build(self, n: int, seed: int) -> tuple[str, float]:
        assert self.overhead is not None
        body = n - int(self.overhead)
        for attempt in range(4):
            rng = random.Random(seed * 16 + attempt)
            cut = fit_prefix(_random_words(rng, body + 8), body, self._vocab.count)
            if cut is not None:
                return cut, n
        raise StrataError(f"could not build a prompt of exactly {body} tokens with "
                          f"{self.label}'s tokenizer")

    def logit_bias(self) -> dict[str, float]:
        return {str(t): EOS_BIAS for t in (self.eos, self.eot) if t is not None}

    def describe(self) -> dict[str, Any]:
        return {"method": "local tokenizer", "tokenizer": self.label,
                "server_tokens_per_prompt": self.overhead, "probes": self.probes,
                **self._checked()}

    def close(self) -> None:
        self._vocab.close()


class CalibratedText(_CountedByServer):
    """No tokenizer at all: the server's usage.prompt_tokens, fitted by probe requests."""

    kind = ("calibrated on the server's usage.prompt_tokens (probe requests fit "
            "k + b·words + a·letters; each prompt's figures use the server's count)")

    def __init__(self, probe: Probe) -> None:
        super().__init__(probe)
        self.per_word = self.per_letter = 0.0
        self.max_probe_error = 0.0

    def calibrate(self) -> bool:
        rng = random.Random(0xCA1B)
        rows, counts = [], []
        for n_words, lengths in PROBES:
            words = [rng.choice(_BY_LENGTH[rng.choice(lengths)]) for _ in range(n_words)]
            counts.append(self._probe(_words_text(words)))
            rows.append((1.0, len(words), sum(len(w) for w in words)))
            self.probes += 1
        a = np.array(rows, dtype=np.float64)
        y = np.array(counts, dtype=np.float64)
        (k, b, per_letter), *_ = np.linalg.lstsq(a, y, rcond=None)
        self.max_probe_error = float(np.max(np.abs(a @ (k, b, per_letter) - y)))
        if b + per_letter * min(_BY_LENGTH) < 0.5:
            raise InputError(f"the server's usage.prompt_tokens does not grow with the prompt "
                             f"(probes of {min(r[1] for r in rows)} and "
                             f"{max(r[1] for r in rows)} words counted {sorted(set(counts))}): "
                             "prompt lengths cannot be calibrated against it")
        self.overhead = round(float(k), 3)
        self.per_word, self.per_letter = round(float(b), 3), round(float(per_letter), 3)
        return True

    def _cost(self, length: int) -> float:
        return self.per_word + self.per_letter * length

    def _build(self, n: int, seed: int) -> tuple[str, float]:
        assert self.overhead is not None
        rng = random.Random(seed)
        remaining = (n - self.overhead) / self.scale
        words: list[str] = []
        longest = max(self._cost(length) for length in _BY_LENGTH)
        while remaining > 3 * longest:
            w = rng.choice(COMMON_WORDS)
            words.append(w)
            remaining -= self._cost(len(w))
        words += [rng.choice(_BY_LENGTH[length])
                  for length in self._finish(remaining, not words, rng)]
        rng.shuffle(words)
        expected = self.overhead + sum(self._cost(len(w)) for w in words)
        return _words_text(words), expected

    def _finish(self, remaining: float, need_one: bool, rng: random.Random) -> tuple[int, ...]:
        """Up to three word lengths whose cost is nearest `remaining` (fewest words on a tie,
        then at random)."""
        best: list[tuple[float, int, float, tuple[int, ...]]] = []
        for k in range(1 if need_one else 0, 4):
            for lengths in combinations_with_replacement(sorted(_BY_LENGTH), k):
                miss = abs(remaining - sum(self._cost(n) for n in lengths))
                best.append((round(miss, 6), k, rng.random(), lengths))
        return min(best)[3]

    def describe(self) -> dict[str, Any]:
        return {"method": "calibrated", "server_tokens_per_prompt": self.overhead,
                "tokens_per_word": self.per_word, "tokens_per_letter": self.per_letter,
                "max_probe_error_tokens": round(self.max_probe_error, 3),
                "probes": self.probes, "scale": round(self.scale, 4),
                **self._checked()}


class GgufVocab:
    """A GGUF's tokenizer through llama.cpp (the vocabulary only, no weights), kept open so
    that cutting a prompt, which tokenizes a dozen prefixes, costs no reload each time."""

    def __init__(self, path: Path) -> None:
        # tokenize_gguf first: it checks the file and installs strata's llama.cpp logger (no
        # llama.cpp chatter on stderr); BackendUnavailable when llama-cpp-python is missing
        from strata.backends.llamacpp_vocab import tokenize_gguf

        tokenize_gguf(path, "a")
        import llama_cpp.llama_cpp as lc

        self._lc = lc
        params = lc.llama_model_default_params()
        params.vocab_only = True
        self._model = lc.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise InputError(f"{path}: llama.cpp could not load this GGUF's vocabulary")
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.eos = self._special(lc.llama_vocab_eos(self._vocab))
        self.eot = self._special(lc.llama_vocab_eot(self._vocab))

    @staticmethod
    def _special(token: int) -> int | None:
        return int(token) if token >= 0 else None

    def count(self, text: str) -> int:
        """Tokens of `text`, no special tokens added or parsed."""
        lc = self._lc
        data = text.encode("utf-8")
        cap = len(data) + 16
        while True:
            buf = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._vocab, data, len(data), buf, cap, False, False)
            if n >= 0:
                return int(n)
            cap = -n  # too small: llama.cpp says how many it needs

    def close(self) -> None:
        if self._model:
            self._lc.llama_model_free(self._model)
            self._model = None
