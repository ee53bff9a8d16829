"""Shape sets built from the synthetic presets' published configs (docs/architecture.md §2,
principle 2: no literals for real model sizes in code that uses them)."""

from __future__ import annotations

from dataclasses import dataclass

from strata.models.presets import list_presets

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
            for p in list_presets() if not p.name.startswith("tiny")]


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
