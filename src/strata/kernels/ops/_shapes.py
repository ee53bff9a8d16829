"""Shape sets built from the synthetic presets' published configs (docs/architecture.md §2,
principle 2: no literals for real model sizes in code that uses them)."""

from __future__ import annotations

from dataclasses import dataclass

from strata.models.presets import kernel_shape_presets

BATCH_ROWS = (1, 8)  # decode of one sequence, and a small batch


@dataclass(frozen=True)
class ModelDims:
    name: str
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


def model_dims() -> list[ModelDims]:
    """Real model dimensions, one per preset (strata's own tiny test models excluded)."""
    return [ModelDims(p.name, p.hidden, p.ffn, p.n_heads, p.n_kv_heads, p.head_dim, p.vocab)
            for p in kernel_shape_presets() if not p.name.startswith("tiny")]


def unique(shapes: list[dict[str, int]]) -> list[dict[str, int]]:
    seen: list[dict[str, int]] = []
    for s in shapes:
        if s not in seen:
            seen.append(s)
    return seen


def rows_by(cols: list[int], rows: tuple[int, ...] = BATCH_ROWS,
            names: tuple[str, str] = ("rows", "cols")) -> list[dict[str, int]]:
    return unique([{names[0]: r, names[1]: c} for c in cols for r in rows])


def hidden_sizes() -> list[int]:
    return sorted({d.hidden for d in model_dims()})


def ffn_sizes() -> list[int]:
    return sorted({d.ffn for d in model_dims()})


def vocab_sizes() -> list[int]:
    return sorted({d.vocab for d in model_dims()})


def attention_heads() -> list[tuple[int, int, int]]:
    """(heads, kv heads, head dim) of each preset, deduplicated."""
    return sorted({(d.heads, d.kv_heads, d.head_dim) for d in model_dims()})


# -- "serve": the shapes the -B lab backend calls ops at -------------------------------------
# Each op's "serve" set spans the row counts the lab (src/strata/lab/model.py) and training
# (src/strata/train/, _training.py) actually run, so an external kernel verified at it may
# serve them (dispatch serves an external kernel only inside the box of the shapes it was
# verified and benchmarked at). The smallest values of every dim come from the "verify"
# set; "serve" adds the largest ones, each paired with small other dims where the product
# would make the float64 oracle slow (a serve set is verified like "verify": 3 seeds).

def lab_ubatch() -> int:
    """Prompt tokens -B lab prefills in one chunk: llama.cpp's n_ubatch default, which
    lab/model.py's UBATCH follows (tests/test_kernels_clauses.py checks they agree)."""
    from strata.backends.base import LoadConfig

    return LoadConfig().ubatch


def lab_rows() -> tuple[int, int]:
    """(decode, a full prefill chunk): the least and most rows a lab op is called with."""
    return (1, lab_ubatch())


def smallest_model() -> ModelDims:
    return min(model_dims(), key=lambda d: (d.hidden, d.ffn))


def largest_model() -> ModelDims:
    return max(model_dims(), key=lambda d: (d.hidden, d.ffn))


def lab_rows_by(col: str) -> list[dict[str, int]]:
    """[decode of the largest model, a full prefill chunk of the smallest], `col` the
    ModelDims field that gives the columns (hidden, ffn)."""
    decode, chunk = lab_rows()
    return [{"rows": decode, "cols": getattr(largest_model(), col)},
            {"rows": chunk, "cols": getattr(smallest_model(), col)}]
