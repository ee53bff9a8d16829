"""strata's x8 layout (kernels/ops/_kquant_x8.py): the same bytes, only moved — `unpack`
restores the file's rows exactly, rows really move (a group of 8 interleaves), and an
embedding lookup (`rows`) returns the file's rows for grouped and tail ids alike."""

from __future__ import annotations

import pytest
import torch

from strata.kernels.ops import _kquant, _kquant_x8


@pytest.mark.parametrize("kind", _kquant_x8.KINDS)
@pytest.mark.parametrize("n", [1, 7, 8, 19, 70])
def test_pack_moves_bytes_and_unpack_and_rows_restore_them(kind: str, n: int) -> None:
    k = 768
    w = _kquant.random_blocks(kind, n, k, seed=n)
    packed = _kquant_x8.pack(kind, w, k)
    assert packed.shape == w.shape and packed.dtype == w.dtype
    assert torch.equal(_kquant_x8.unpack(kind, packed, k), w)
    assert torch.equal(packed.reshape(-1).sort().values, w.reshape(-1).sort().values)
    if n >= _kquant_x8.ROWS:
        assert not torch.equal(packed, w)  # a whole group of 8 rows is interleaved
    else:
        assert torch.equal(packed, w)  # nothing to group: the file's layout
    ids = torch.tensor([0, n - 1, n // 2, n - 1, min(9, n - 1)])
    assert torch.equal(_kquant_x8.rows(kind, packed, ids, k), w[ids])
