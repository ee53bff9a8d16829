"""strata's x8 layout of q4_K and q6_K tensors: eight weight rows interleaved per super-block,
so a SIMD lane holds one row and a single-row dot (decode) reads every byte once with no
per-row scale broadcasts. `-B lab` repacks at load; the bytes are the same as stored (the
same count, only moved), so repacking loses nothing and `unpack` restores the file's layout.

A tensor of N rows (row = K/256 super-blocks) is stored as G = N // 8 groups of 8 rows, each
group super-block after super-block ([g][s][group bytes]), then the N % 8 remaining rows in
the file's own layout. One group super-block (rows r = 0..7 of the group):

  q4_K, 1152 B:  d[8] fp16 | dmin[8] fp16 | packed scales in 3 planes of 32 B (plane t holds
                 bytes 4t..4t+3 of each row's 12) | qs in 32 slices u of 32 B (slice u holds
                 bytes 4u..4u+3 of each row's 128)
  q6_K, 1680 B:  d[8] fp16 | scales[16][8] int8 (sub-block j of rows 0..7) | then for half
                 h = 0, 1 and k = 0..7, three 32 B slices: bytes 64h+4k.., 64h+32+4k.. of ql
                 and 32h+4k.. of qh (4 of each row): what one step of the dot reads, in the
                 order it reads them (interleaved streams within a group ran at a third of
                 the bandwidth once the weights came from DRAM: the prefetcher lost them)

Each field keeps ggml's encoding (ggml-common.h, _kquant.py): only whole bytes move.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from strata.kernels.ops._kquant import BLOCK_BYTES, QK_K

ROWS = 8  # rows per group: one per 32-bit lane of a 256-bit register


@dataclass(frozen=True)
class Field:
    """A field of a super-block: bytes [start, start + size) of the file's block, moved as
    `unit`-byte pieces (rows interleaved piece by piece; unit == size: the whole field)."""

    start: int
    size: int
    unit: int


# fields in group order (the order they sit in a group super-block)
FIELDS = {
    "q4_K": (Field(0, 2, 2), Field(2, 2, 2), Field(4, 12, 4), Field(16, 128, 4)),
    "q6_K": (Field(208, 2, 2), Field(192, 16, 1),
             *(Field(at, 4, 4) for h in range(2) for k in range(8)
               for at in (64 * h + 4 * k, 64 * h + 32 + 4 * k, 128 + 32 * h + 4 * k))),
}
KINDS = tuple(FIELDS)


def _check(kind: str, w: Any, k: int) -> tuple[int, int]:
    if kind not in FIELDS:
        raise ValueError(f"no x8 layout for {kind}")
    nsb = k // QK_K
    if k % QK_K or w.shape[-1] != nsb * BLOCK_BYTES[kind]:
        raise ValueError(f"{kind}: rows of {w.shape[-1]} B do not hold K = {k}")
    return w.shape[0], nsb


def pack(kind: str, w: Any, k: int) -> Any:
    """The file's rows w (uint8 [N, K/256·block]) in the x8 layout (a new tensor, same shape)."""
    import torch

    n, nsb = _check(kind, w, k)
    g = n // ROWS
    blocks = w[:g * ROWS].reshape(g, ROWS, nsb, BLOCK_BYTES[kind]).permute(0, 2, 1, 3)
    parts = []
    for f in FIELDS[kind]:
        piece = blocks[..., f.start:f.start + f.size].reshape(g, nsb, ROWS, f.size // f.unit,
                                                              f.unit)
        parts.append(piece.permute(0, 1, 3, 2, 4).reshape(g, nsb, ROWS * f.size))
    head = torch.cat(parts, dim=2).reshape(-1)
    return torch.cat([head, w[g * ROWS:].reshape(-1)]).reshape(w.shape)


def unpack(kind: str, w: Any, k: int) -> Any:
    """The x8 layout back in the file's layout (`pack`'s inverse)."""
    import torch

    n, nsb = _check(kind, w, k)
    g, block = n // ROWS, BLOCK_BYTES[kind]
    flat = w.reshape(-1)
    groups = flat[:g * ROWS * nsb * block].reshape(g, nsb, ROWS * block)
    out = torch.empty(g, nsb, ROWS, block, dtype=w.dtype, device=w.device)
    at = 0
    for f in FIELDS[kind]:
        span = ROWS * f.size
        piece = groups[..., at:at + span].reshape(g, nsb, f.size // f.unit, ROWS, f.unit)
        out[..., f.start:f.start + f.size] = piece.permute(0, 1, 3, 2, 4).reshape(
            g, nsb, ROWS, f.size)
        at += span
    head = out.permute(0, 2, 1, 3).reshape(-1)
    return torch.cat([head, flat[g * ROWS * nsb * block:]]).reshape(w.shape)


def rows(kind: str, w: Any, ids: Any, k: int) -> Any:
    """Rows `ids` of an x8-packed tensor in the file's layout (an embedding lookup): one
    gather of each row's bytes, wherever its group put them."""
    import torch

    n, nsb = _check(kind, w, k)
    row_bytes = nsb * BLOCK_BYTES[kind]
    grouped = n // ROWS * ROWS
    ids = ids.to(device=w.device, dtype=torch.int64)
    within = _row_places(kind, k).to(w.device)  # [ROWS, row_bytes]
    places = (ids // ROWS * ROWS * row_bytes)[:, None] + within[ids % ROWS]
    tail = ids >= grouped  # the last N % 8 rows, in the file's layout
    places[tail] = (ids[tail] * row_bytes)[:, None] + torch.arange(row_bytes, device=w.device)
    return w.reshape(-1)[places]


@functools.cache
def _row_places(kind: str, k: int) -> Any:
    """[ROWS, row bytes]: where byte j of a group's row r sits within its packed group
    (`pack` applied to the bytes' own indices, inverted)."""
    import torch

    row_bytes = k // QK_K * BLOCK_BYTES[kind]
    labels = torch.arange(ROWS * row_bytes, dtype=torch.int64).reshape(ROWS, row_bytes)
    packed = pack(kind, labels, k).reshape(-1)
    places = torch.empty_like(packed)
    places[packed] = torch.arange(packed.numel())
    return places.reshape(ROWS, row_bytes)
