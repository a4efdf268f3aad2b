"""Microbatch split and merge follow torch (tensor_split on dim 0); merge undoes split."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeforge.runtime.microbatch import as_tuple, merge_chunks, split_args, split_value


@pytest.mark.parametrize("rows, chunks, sizes", [
    (8, 4, [2, 2, 2, 2]),
    (7, 3, [3, 2, 2]),
    (3, 3, [1, 1, 1]),
    (5, 1, [5]),
])
def test_split_sizes_match_torch_tensor_split(rows, chunks, sizes):
    parts = split_value(torch.arange(rows), chunks)
    assert [len(p) for p in parts] == sizes
    assert [p.tolist() for p in parts] == [t.tolist() for t in torch.tensor_split(torch.arange(rows), chunks)]


def test_split_args_splits_tensors_and_repeats_other_values():
    x, mask = torch.arange(6).reshape(6, 1), torch.ones(6)
    chunks = split_args((x, "scale", mask), 3)
    assert len(chunks) == 3
    assert [c[0].flatten().tolist() for c in chunks] == [[0, 1], [2, 3], [4, 5]]
    assert all(c[1] == "scale" for c in chunks)


def test_tuples_split_element_by_element():
    pair = (torch.arange(4), torch.arange(4) * 10)
    chunks = split_value(pair, 2)
    assert chunks[1][1].tolist() == [20, 30]
    assert merge_chunks(chunks)[1].tolist() == [0, 10, 20, 30]


@pytest.mark.parametrize("value, chunks", [(torch.tensor(1.0), 2), (torch.arange(2), 3)])
def test_too_few_rows_is_a_clear_error(value, chunks):
    with pytest.raises(ValueError, match="microbatches"):
        split_value(value, chunks)


def test_as_tuple():
    t = torch.ones(1)
    assert as_tuple(t) == (t,)
    assert as_tuple((t, t)) == (t, t)
    assert as_tuple([t]) == (t,)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), width=st.integers(1, 5), data=st.data())
def test_merge_undoes_split(rows, width, data):
    chunks = data.draw(st.integers(1, rows))
    x = torch.randn(rows, width)
    assert torch.equal(merge_chunks(split_value(x, chunks)), x)
