"""Hypothesis fuzz of every message a mesh member can send us (issue 14 item 10): whatever a member
sends, the decoders raise only their typed errors and the membership core counts and carries on.

Each strategy starts from a VALID message of its kind and mutates it (a field replaced by any
CBOR-able value, a field dropped, a field added), plus wholly arbitrary values, so the fuzz reaches
the checks behind the type dispatch, not only the first one.
"""

from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hydra_node.inference import GenerationRequest, InvalidRequest, RemoteError, event_from_wire
from hydra_node.mesh.membership import (
    Ack,
    Announcement,
    Gossip,
    Leave,
    Membership,
    MembershipConfig,
    ModelEntry,
    PeerRecord,
    PeerState,
    Ping,
    PingReq,
    Pull,
    Sync,
)
from hydra_node.mesh.membership.announcement import InvalidMessage
from hydra_node.mesh.membership.messages import DigestEntry, decode_message

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

cbor_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=True),
    st.text(max_size=40),
    st.binary(max_size=40),
)
cbor_values = st.recursive(
    cbor_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=5)),
    max_leaves=30,
)

ANN = Announcement(node_id="b", addresses=("b.lan:7946",), models=(ModelEntry("m", "ready"),))
VALID = [
    Ping(3).to_wire(),
    Ack(3, "b").to_wire(),
    PingReq(4, "c").to_wire(),
    Gossip((PeerRecord("c", 1, PeerState.DEAD), PeerRecord("b", 0, PeerState.ALIVE, ANN))).to_wire(),
    Leave(2).to_wire(),
    Pull(("c", "d")).to_wire(),
    Sync((DigestEntry("c", 1, PeerState.ALIVE, 3),), (PeerRecord("b", 0, PeerState.ALIVE, ANN),)).to_wire(),
]


@st.composite
def mutated(draw) -> object:
    base = dict(draw(st.sampled_from(VALID)))
    how = draw(st.sampled_from(["replace", "drop", "add", "nest", "whole"]))
    keys = sorted(base)
    if how == "replace":
        base[draw(st.sampled_from(keys))] = draw(cbor_values)
    elif how == "drop":
        base.pop(draw(st.sampled_from(keys)))
    elif how == "add":
        base[draw(st.text(max_size=10))] = draw(cbor_values)
    elif how == "nest":
        key = draw(st.sampled_from(keys))
        base[key] = [base[key], draw(cbor_values)]
    else:
        return draw(cbor_values)
    return base


@SETTINGS
@given(msgs=st.lists(mutated(), min_size=1, max_size=8))
def test_the_membership_core_counts_every_bad_message_and_carries_on(msgs) -> None:
    core = Membership(
        Announcement(node_id="a", addresses=("a.lan:7946",)), MembershipConfig(), random.Random(0), now=0.0
    )
    core.on_message("b", Gossip((PeerRecord("b", 0, PeerState.ALIVE, ANN),)).to_wire(), 0.0)
    for i, msg in enumerate(msgs):
        try:
            decode_message(msg)
        except InvalidMessage:
            pass  # the only error a decoder may raise
        core.on_message("b", msg, float(i))  # never raises
        core.tick(float(i) + 0.5)
    stats = core.statistics(100.0)
    assert math.isfinite(core.next_deadline()) and stats is not None
    assert core.incarnation < 2**63 - 1


@SETTINGS
@given(
    wire=st.one_of(
        cbor_values,
        st.builds(lambda v, k: {**ANN.to_wire(), k: v}, cbor_values, st.sampled_from(sorted(ANN.to_wire()))),
    )
)
def test_announcements_decode_or_raise_invalid_message(wire) -> None:
    try:
        Announcement.from_wire(wire)
    except InvalidMessage:
        pass


GOOD_REQ = GenerationRequest(model="m", kind="chat", messages=(("user", "hi"),), max_tokens=4).to_wire()


@SETTINGS
@given(
    wire=st.one_of(
        cbor_values,
        st.builds(
            lambda v, k: {**GOOD_REQ, k: v},
            cbor_values,
            st.sampled_from(sorted(GOOD_REQ) + ["tools", "logit_bias", "grammar", "prompt_tokens", "logprobs"]),
        ),
    )
)
def test_generate_requests_from_a_peer_decode_or_raise_invalid_request(wire) -> None:
    try:
        GenerationRequest.from_wire(wire)
    except InvalidRequest:
        pass


@SETTINGS
@given(
    wire=st.one_of(
        cbor_values,
        st.builds(
            lambda v, k: {"type": "delta", "text": "x", k: v},
            cbor_values,
            st.sampled_from(["text", "logprobs", "type"]),
        ),
        st.builds(
            lambda v, k: {
                "type": "finished",
                "finish_reason": "stop",
                "prompt_tokens": 1,
                "completion_tokens": 1,
                k: v,
            },
            cbor_values,
            st.sampled_from(["prompt_tokens", "ttft_ms", "served_by", "finish_reason"]),
        ),
    )
)
def test_generate_events_from_a_peer_decode_or_raise_remote_error(wire) -> None:
    try:
        event_from_wire(wire)
    except RemoteError:
        pass
