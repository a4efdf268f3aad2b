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


# -- torch's splitting of nested inputs, and its merging of outputs -----------------------------

from collections import OrderedDict, namedtuple  # noqa: E402
from dataclasses import dataclass  # noqa: E402

from pipeforge.runtime.microbatch import split_inputs  # noqa: E402
from pipeforge.runtime.p2p import PipelineUsageError  # noqa: E402

Pair = namedtuple("Pair", "ids mask")


def test_a_dict_batch_is_split_field_by_field_not_given_whole():
    batch = {"ids": torch.arange(6), "nested": [torch.arange(6) * 2, "keep"], "scale": 0.5}
    chunks = split_value(batch, 3)
    assert [c["ids"].tolist() for c in chunks] == [[0, 1], [2, 3], [4, 5]]
    assert [c["nested"][0].tolist() for c in chunks] == [[0, 2], [4, 6], [8, 10]]
    assert all(c["nested"][1] == "keep" and c["scale"] == 0.5 for c in chunks)


def test_args_and_kwargs_split_as_torch_splits_them():
    from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

    args = (torch.arange(10).reshape(5, 2), {"a": torch.arange(5), "b": 3})
    kwargs = {"mask": torch.ones(5, 3), "pair": Pair(torch.arange(5), torch.zeros(5)), "flag": True}
    ours = split_inputs(args, kwargs, 2)
    want_args, want_kwargs = split_args_kwargs_into_chunks(args, kwargs, 2)
    for (got_args, got_kwargs), want_a, want_k in zip(ours, want_args, want_kwargs):
        assert torch.equal(got_args[0], want_a[0]) and torch.equal(got_args[1]["a"], want_a[1]["a"])
        assert got_args[1]["b"] == want_a[1]["b"] == 3
        assert torch.equal(got_kwargs["mask"], want_k["mask"]) and got_kwargs["flag"] is True
        assert isinstance(got_kwargs["pair"], Pair) and torch.equal(got_kwargs["pair"].ids, want_k["pair"].ids)


def test_containers_that_hide_tensors_are_refused_by_name():
    @dataclass
    class Batch:
        ids: torch.Tensor

    with pytest.raises(PipelineUsageError, match=r"keyword 'batch'.*Batch holding tensors"):
        split_inputs((), {"batch": Batch(torch.arange(4))}, 2)
    with pytest.raises(PipelineUsageError, match=r"argument 0\['x'\]: 1 rows"):
        split_inputs(({"x": torch.ones(1)},), {}, 2)
    with pytest.raises(PipelineUsageError, match="0-dimensional"):
        split_inputs((torch.tensor(3.0),), {}, 2)


def test_outputs_merge_field_by_field():
    chunks = [{"logits": torch.ones(2, 3) * m, "aux": (torch.full((1,), m), "tag"), "loss": torch.tensor(float(m))}
              for m in range(3)]
    merged = merge_chunks(chunks)
    assert merged["logits"].shape == (6, 3) and merged["aux"][0].tolist() == [0, 1, 2]
    assert merged["aux"][1] == "tag" and merged["loss"].tolist() == [0.0, 1.0, 2.0]
    ordered = merge_chunks([OrderedDict(a=torch.ones(1)), OrderedDict(a=torch.zeros(1))])
    assert isinstance(ordered, OrderedDict) and ordered["a"].tolist() == [1.0, 0.0]
    assert merge_chunks([Pair(torch.ones(1), 1), Pair(torch.ones(1), 2)]).mask == [1, 2]
