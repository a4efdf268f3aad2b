"""Receives posted early (semantics.early_receives) keep the pairing the verifier checked."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeforge
from pipeforge.ir import Action, ActionKind
from pipeforge.library import names
from pipeforge.passes.lower import lower
from pipeforge.semantics import early_receives
from pipeforge.verifier.matching import early_receives_pair_alike

RECV_F, RECV_B = ActionKind.RECV_F, ActionKind.RECV_B


def lowered(name: str):
    return lower(pipeforge.load(name, defines={"P": 4, "M": 8}))


def test_a_peer_stops_at_its_first_receive_not_ready_and_the_others_go_on():
    receives = [Action(1, RECV_F, 0), Action(3, RECV_B, 0), Action(1, RECV_F, 1), Action(3, RECV_B, 1),
                Action(1, RECV_F, 2)]
    peer = {1: 0, 3: 4}
    not_ready = {Action(1, RECV_F, 1)}
    early = early_receives(receives, lambda r: peer[r[0]], lambda r: r not in not_ready)
    assert early == [Action(1, RECV_F, 0), Action(3, RECV_B, 0), Action(3, RECV_B, 1)]
    assert early_receives(receives, lambda r: peer[r[0]], lambda r: False) == []
    assert early_receives(receives, lambda r: peer[r[0]], lambda r: True) == receives


@pytest.mark.parametrize("name", names())
def test_every_library_schedule_pairs_alike_with_every_receive_posted_early(name):
    assert early_receives_pair_alike(lowered(name))


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(["1f1b", "interleaved-1f1b", "zbv", "dualpipev", "chimera"]), seed=st.integers(0, 2**16))
def test_pairs_alike_whichever_buffers_are_known(name, seed):
    known = lambda key: hash((seed, tuple(key))) % 3 != 0  # noqa: E731 (a third of the buffers unknown)
    assert early_receives_pair_alike(lowered(name), known)


def test_a_rule_that_lets_a_receive_pass_one_from_its_peer_is_caught():
    def skipping(receives, peer_of, ready):  # wrong: goes on past a receive that is not ready
        return [r for index, r in enumerate(receives) if index % 2 == 0]

    assert not early_receives_pair_alike(lowered("1f1b"), choose=skipping)
