"""Per-position quality figures from logits (pure numpy, float64 for the reductions).

NLL_i   = -log p_model(t_{i+1} | t_0..t_i)                perplexity = exp(mean NLL)
KL_i    = sum_v p_ref(v) (log p_ref(v) - log p_model(v))  KL(reference || model), as
          llama.cpp's --kl-divergence: how far the model's distribution is from the one it
          should reproduce
top-1_i = argmax p_model == argmax p_ref
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from strata.measure.stats import t95


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@dataclass
class ChunkScore:
    nll: np.ndarray  # per scored position
    ref_nll: np.ndarray | None = None
    kl: np.ndarray | None = None
    top1: np.ndarray | None = None  # bool


def score_chunk(logits: np.ndarray, targets: np.ndarray,
                ref_logits: np.ndarray | None = None) -> ChunkScore:
    """`logits` [n, vocab] are the scored rows (row j predicts targets[j])."""
    if logits.shape[0] != len(targets):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(targets)} targets")
    logp = log_softmax(logits)
    rows = np.arange(len(targets))
    score = ChunkScore(nll=-logp[rows, targets])
    if ref_logits is None:
        return score
    if ref_logits.shape != logits.shape:
        raise ValueError(f"reference logits {ref_logits.shape} vs model {logits.shape}")
    ref_logp = log_softmax(ref_logits)
    score.ref_nll = -ref_logp[rows, targets]
    # Clamp: rounding makes KL of identical rows a hair below zero, never meaningfully.
    score.kl = np.maximum((np.exp(ref_logp) * (ref_logp - logp)).sum(axis=-1), 0.0)
    score.top1 = logits.argmax(axis=-1) == ref_logits.argmax(axis=-1)
    return score


@dataclass
class Figures:
    """Summary over every scored position of a run."""

    n_tokens: int
    n_chunks: int
    ppl: float
    ppl_sd: float  # llama.cpp's "±": PPL x SD of the mean NLL over tokens
    ppl_ci95: tuple[float, float] | None  # from the spread of chunk means (None: 1 chunk)
    chunk_nll: list[float] = field(default_factory=list)  # mean NLL per chunk (raw samples)
    ref_ppl: float | None = None
    delta_ppl: float | None = None  # PPL(model) - PPL(ref), on the same positions
    kl: float | None = None  # mean KL(ref || model)
    kl_median: float | None = None
    kl_p99: float | None = None
    kl_max: float | None = None
    top1: float | None = None  # fraction of positions with the same most likely token


def _ppl_sd(nll: np.ndarray) -> float:
    n = len(nll)
    if n < 2:
        return math.nan
    return math.exp(nll.mean()) * float(nll.std(ddof=1)) / math.sqrt(n)


def _chunk_ci(chunk_means: np.ndarray) -> tuple[float, float] | None:
    # Tokens of one chunk share context, so they are not independent samples; chunks are
    # closer to it. The CI of the mean NLL over chunks, mapped through exp.
    k = len(chunk_means)
    if k < 2:
        return None
    half = t95(k - 1) * float(chunk_means.std(ddof=1)) / math.sqrt(k)
    mean = float(chunk_means.mean())
    return math.exp(mean - half), math.exp(mean + half)


def summarize(scores: list[ChunkScore]) -> Figures:
    if not scores:
        raise ValueError("no chunks scored")
    nll = np.concatenate([s.nll for s in scores])
    chunk_means = np.array([s.nll.mean() for s in scores])
    fig = Figures(n_tokens=len(nll), n_chunks=len(scores), ppl=math.exp(nll.mean()),
                  ppl_sd=_ppl_sd(nll), ppl_ci95=_chunk_ci(chunk_means),
                  chunk_nll=chunk_means.tolist())
    if all(s.kl is not None for s in scores):
        _add_reference(fig, scores)
    return fig


def _add_reference(fig: Figures, scores: list[ChunkScore]) -> None:
    ref_nll = np.concatenate([s.ref_nll for s in scores if s.ref_nll is not None])
    kl = np.concatenate([s.kl for s in scores if s.kl is not None])
    top1 = np.concatenate([s.top1 for s in scores if s.top1 is not None])
    fig.ref_ppl = math.exp(ref_nll.mean())
    fig.delta_ppl = fig.ppl - fig.ref_ppl
    fig.kl = float(kl.mean())
    fig.kl_median = float(np.median(kl))
    fig.kl_p99 = float(np.percentile(kl, 99))
    fig.kl_max = float(kl.max())
    fig.top1 = float(top1.mean())
