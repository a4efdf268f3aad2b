"""The shape header that travels ahead of the first activation (encode/decode round trip and limits), and the
gloo groups each direction of messages travels on."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeforge.runtime.p2p import DTYPES, HEADER_LENGTH, PipelineError, TensorMeta, decode_header, encode_header
from pipeforge.tools.launch import spawn

CPU = torch.device("cpu")

metas = st.builds(
    TensorMeta,
    st.lists(st.integers(0, 2**31), max_size=4).map(tuple),
    st.sampled_from(DTYPES),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(metas, max_size=6))
def test_header_round_trip(items):
    header = encode_header(items, CPU)
    assert header.shape == (HEADER_LENGTH,) and header.dtype == torch.int64
    assert decode_header(header) == tuple(items)


def test_header_of_a_scalar_and_a_matrix():
    items = [TensorMeta((), torch.float64), TensorMeta((3, 4), torch.bfloat16)]
    assert decode_header(encode_header(items, CPU)) == tuple(items)


def test_too_many_tensors_is_refused():
    with pytest.raises(PipelineError, match="too large"):
        encode_header([TensorMeta((1, 2, 3, 4, 5), torch.float32)] * 20, CPU)


def test_unsupported_dtype_is_refused():
    with pytest.raises(PipelineError, match="dtype"):
        encode_header([TensorMeta((2,), torch.complex64)], CPU)


def test_meta_of_a_tensor_allocates_the_same():
    t = torch.zeros(2, 3, dtype=torch.float16)
    meta = TensorMeta.of(t)
    assert meta == TensorMeta((2, 3), torch.float16)
    assert meta.empty(CPU).shape == t.shape


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_each_direction_travels_on_its_own_gloo_group():
    outcomes = spawn("tests.runtime.p2p_jobs:directions", 2, "pipeforge/test/p2p/directions", timeout=30, deadline=90)
    assert all(o.ok for o in outcomes), "\n".join(o.error for o in outcomes if not o.ok)
    for rank, outcome in enumerate(outcomes):
        assert outcome.value == {"received": [float(2 - rank)] * 3, "apart": True}
