"""Shapes of a training step (`strata train`): the backward ops see every token of a batch
at once, so their row count is batch x context, not the 1-8 rows of decoding.

The dimensions come from strata train's presets (src/strata/train/presets.py) where that
module exists; until then from the values its plan fixes for the `tiny` preset, plus one
wider model so the benchmark also covers a shape that no longer fits in L2.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainDims:
    name: str
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    tokens: int  # batch * ctx: the rows one optimizer step's backward walks


# Fallbacks (documented in the issue 13 plan) used only while train/presets.py is absent.
_PLANNED = (TrainDims("tiny", 128, 384, 4, 2, 32, 16 * 128),
            TrainDims("wider", 512, 1536, 8, 4, 64, 16 * 128))


def _from_presets() -> list[TrainDims]:
    try:
        from strata.train.presets import PRESETS
    except ImportError:
        return []
    found = []
    for name in ("tiny", "small"):
        p = PRESETS.get(name)
        if p is not None:
            m = p.model
            found.append(TrainDims(name, m.hidden, m.ffn, m.n_heads, m.n_kv_heads,
                                   m.hidden // m.n_heads, p.batch * m.ctx))
    return found


def training_dims() -> list[TrainDims]:
    """The training presets' dimensions plus one wider model, deduplicated, smallest first."""
    found = _from_presets() or list(_PLANNED[:1])
    widest = max(d.hidden for d in found)
    if widest < _PLANNED[1].hidden:
        found.append(_PLANNED[1])
    return sorted({d.hidden: d for d in found}.values(), key=lambda d: d.hidden)


def trained_dims() -> list[TrainDims]:
    """Only what `strata train` runs (its presets; the planned `tiny` before they exist):
    the "serve" shapes, unlike training_dims() which adds a wider model for benchmarks."""
    return sorted(_from_presets() or list(_PLANNED[:1]), key=lambda d: d.tokens)


def serve_rows_by(col: str) -> list[dict[str, int]]:
    """{rows: batch x ctx, cols: the preset's `col` (hidden, ffn)} per training preset."""
    return [{"rows": d.tokens, "cols": getattr(d, col)} for d in trained_dims()]
