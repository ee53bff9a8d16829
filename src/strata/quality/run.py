"""The quality measurement: every input check first (no weights loaded), then the chunks
through each backend with the model and, with --ref, the reference loaded side by side."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from strata.errors import InputError
from strata.models.source import ResolvedModel, resolve
from strata.quality.chunks import MIN_CTX, ChunkPlan
from strata.quality.metrics import ChunkScore, Figures, score_chunk, summarize
from strata.quality.scorers import Scorer, choose_backends, open_scorer
from strata.quality.text import Text, load_text
from strata.quality.tokenizer import Tokens, tokenize

DEFAULT_CTX = 512  # llama-perplexity's default
# 32 chunks of 512 = 8160 scored tokens, llama-perplexity's --chunks: on 2 idle CPU cores
# synthetic:smollm2-135m@q8_0 scores a chunk in ~2 s with llama.cpp, so the default run takes
# ~75 s (the tests print the time); raise it for a tighter CI.
DEFAULT_MAX_CHUNKS = 32

Progress = Callable[[int, int], None]  # (chunks done, chunks in all)


@dataclass(frozen=True)
class QualityConfig:
    model: str
    ref: str | None = None
    text: Path | None = None
    ctx: int = DEFAULT_CTX
    backend: str = "auto"  # see scorers.BACKEND_CHOICES
    max_chunks: int = DEFAULT_MAX_CHUNKS
    # what the results call the model when `model` is not a name a user knows (--quants: a
    # cached file, named "MODEL@q4_k_m"); the file itself is kept in info["model_file"]
    name: str | None = None


@dataclass
class Prepared:
    """Everything checked and tokenised; what is left is loading weights and scoring."""

    config: QualityConfig
    model: ResolvedModel
    ref: ResolvedModel | None
    text: Text
    plan: ChunkPlan
    backends: list[str]


# -- checks ------------------------------------------------------------------------------


def _check_flags(config: QualityConfig) -> None:
    if config.ctx < MIN_CTX:
        raise InputError(f"--ctx {config.ctx}: must be at least {MIN_CTX} (half of each "
                         "context is scored)")
    if config.max_chunks < 1:
        raise InputError(f"--max-chunks {config.max_chunks}: must be at least 1")


def _check_ctx(model: ResolvedModel, ctx: int) -> None:
    limit = model.spec.ctx_max if model.spec else 0
    if limit and ctx > limit:  # 0: the model does not say
        raise InputError(f"--ctx {ctx}: {model.ref} takes at most {limit} tokens of context "
                         f"(its ctx_max); use --ctx {limit} or less")


def _check_length(tokens: Tokens, config: QualityConfig, text: Text) -> None:
    n = len(tokens)
    if n >= config.ctx:
        return
    fix = f"use --ctx {n} or less, or " if n >= MIN_CTX else ""
    raise InputError(f"text {text.name}: {n} tokens with {config.model}'s tokenizer, shorter "
                     f"than one context of --ctx {config.ctx} (needs at least {config.ctx} "
                     f"tokens); {fix}give a longer --text")


def _check_same_vocab(model: ResolvedModel, ref: ResolvedModel, tokens: Tokens,
                      text: Text) -> None:
    """KL compares distributions token by token: both models must share one vocabulary."""
    sizes = (model.spec.vocab if model.spec else None, ref.spec.vocab if ref.spec else None)
    if None not in sizes and sizes[0] != sizes[1]:
        raise InputError(f"--ref {ref.ref}: vocabulary of {sizes[1]} tokens, {model.ref} has "
                         f"{sizes[0]}; KL and top-1 need the same tokenizer (compare "
                         "quantisations of one model)")
    theirs = tokenize(ref, text.content)
    if theirs.bos != tokens.bos or not np.array_equal(theirs.ids, tokens.ids):
        at = _first_difference(tokens.ids, theirs.ids)
        raise InputError(f"--ref {ref.ref}: tokenises the text differently from {model.ref} "
                         f"(first difference at token {at}); KL and top-1 need the same "
                         "tokenizer")


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def prepare(config: QualityConfig) -> Prepared:
    """Resolve, read, tokenise and check everything before any weights are loaded."""
    _check_flags(config)
    model = resolve(config.model)
    ref = resolve(config.ref) if config.ref else None
    models = [model] + ([ref] if ref else [])
    for m in models:
        _check_ctx(m, config.ctx)
    backends = choose_backends(config.backend, models)
    text = load_text(config.text)
    tokens = tokenize(model, text.content)
    _check_length(tokens, config, text)
    if ref is not None:
        _check_same_vocab(model, ref, tokens, text)
    return Prepared(config, model, ref, text,
                    ChunkPlan.of(tokens, config.ctx, config.max_chunks), backends)


# -- the measurement ---------------------------------------------------------------------


@dataclass
class QualityResult:
    """One backend's figures; `to_dict` is what the DB stores and --json prints."""

    model: str
    ref: str | None
    backend: str
    ctx: int
    figures: Figures
    text_name: str
    text_sha256: str
    text_tokens: int  # tokens of the whole text (the chunks use the first ones)
    tokenizer: str
    seconds: float  # wall time: loading both models + every chunk
    model_label: str  # storage type, e.g. "q4_0": what the frontier line names
    ref_label: str | None = None
    speed: dict[str, Any] | None = None  # speed.SpeedRatio.to_dict(), when the DB has one
    info: dict[str, Any] = field(default_factory=dict)  # backend versions and settings

    def to_dict(self) -> dict[str, Any]:
        f = asdict(self.figures)
        return {
            "model": self.model, "ref": self.ref, "backend": self.backend, "ctx": self.ctx,
            "n_chunks": f.pop("n_chunks"), "n_tokens": f.pop("n_tokens"),
            **f, "speed_ratio": self.speed["ratio"] if self.speed else None,
            "speed": self.speed,
            "text": {"name": self.text_name, "sha256": self.text_sha256,
                     "tokens": self.text_tokens},
            "tokenizer": self.tokenizer, "seconds": self.seconds,
            "model_label": self.model_label, "ref_label": self.ref_label,
            "scoring": "llama-perplexity's: text tokenised with BOS when the vocab adds one, "
                       "chunks of ctx tokens from an empty cache, BOS in place of each later "
                       "chunk's first token, second half scored; KL(ref || model)",
            "info": self.info,
        }


def label(model: ResolvedModel) -> str:
    """What the model is called by its quantisation: the file's mix (q4_k_m), else its
    largest storage type."""
    spec = model.spec_for("gguf") if "gguf" in model.artefacts else model.spec
    return spec.quant_label().lower() if spec else model.ref


def _score(plan: ChunkPlan, i: int, scorer: Scorer, ref: Scorer | None) -> ChunkScore:
    ids = plan.inputs(i)
    logits = scorer.logits(ids, plan.first)[:-1]  # the last position predicts past the chunk
    ref_logits = ref.logits(ids, plan.first)[:-1] if ref is not None else None
    if ref_logits is not None and ref_logits.shape != logits.shape:
        raise InputError(f"--ref: {ref_logits.shape[1]} logits per position, the model has "
                         f"{logits.shape[1]}; KL needs the same vocabulary")
    return score_chunk(logits, plan.targets(i), ref_logits)


def run_quality(p: Prepared, backend: str, progress: Progress | None = None) -> QualityResult:
    """Score every planned chunk on `backend`: model (and reference) loaded together."""
    t0 = time.perf_counter_ns()  # a duration for the report, not a benchmark figure
    scorers: list[Scorer] = []
    try:
        scorers.append(open_scorer(backend, p.model, p.plan.ctx))
        if p.ref is not None:
            scorers.append(open_scorer(backend, p.ref, p.plan.ctx))
        ref = scorers[1] if p.ref is not None else None
        scores = []
        for i in range(p.plan.n_chunks):
            scores.append(_score(p.plan, i, scorers[0], ref))
            if progress:
                progress(i + 1, p.plan.n_chunks)
        info = scorers[0].info()
        if p.config.name:
            info = {**info, "model_file": p.model.ref}
    finally:
        for s in scorers:
            s.close()
    return QualityResult(
        model=p.config.name or p.model.ref, ref=p.ref.ref if p.ref else None, backend=backend,
        ctx=p.plan.ctx,
        figures=summarize(scores), text_name=p.text.name, text_sha256=p.text.sha256,
        text_tokens=len(p.plan.tokens), tokenizer=p.plan.tokens.scheme,
        seconds=(time.perf_counter_ns() - t0) / 1e9, model_label=label(p.model),
        ref_label=label(p.ref) if p.ref else None, info=info)
