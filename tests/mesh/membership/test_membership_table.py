"""The peer state table, announcement validation and the message wire forms."""

from __future__ import annotations

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.mesh.membership import (
    TRANSITIONS,
    Ack,
    Announcement,
    DigestEntry,
    Gossip,
    Hardware,
    InvalidMessage,
    Leave,
    LocalMembershipError,
    MembershipConfig,
    ModelEntry,
    PeerRecord,
    PeerState,
    Ping,
    PingReq,
    Pull,
    RpcCapacity,
    Sync,
    Trigger,
    decode_message,
    transition,
)

S, T = PeerState, Trigger

EXPECTED = {
    (S.UNKNOWN, T.ALIVE): S.ALIVE,
    (S.UNKNOWN, T.CONFIRM): S.DEAD,
    (S.UNKNOWN, T.LEAVE): S.LEFT,
    (S.ALIVE, T.ALIVE): S.ALIVE,
    (S.ALIVE, T.SUSPECT): S.SUSPECT,
    (S.ALIVE, T.LEAVE): S.LEFT,
    (S.SUSPECT, T.ALIVE): S.ALIVE,
    (S.SUSPECT, T.SUSPECT): S.SUSPECT,
    (S.SUSPECT, T.CONFIRM): S.DEAD,
    (S.SUSPECT, T.LEAVE): S.LEFT,
    (S.DEAD, T.ALIVE): S.ALIVE,
    (S.DEAD, T.LEAVE): S.LEFT,
    (S.DEAD, T.EXPIRE): S.UNKNOWN,
    (S.LEFT, T.ALIVE): S.ALIVE,
    (S.LEFT, T.CONFIRM): S.DEAD,
    (S.LEFT, T.EXPIRE): S.UNKNOWN,
}


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("trigger", list(T))
def test_transition_table(state: PeerState, trigger: Trigger) -> None:
    if (state, trigger) in EXPECTED:
        assert transition(state, trigger) is EXPECTED[(state, trigger)]
    else:
        with pytest.raises(LocalMembershipError, match=state.value):
            transition(state, trigger)


def test_table_has_exactly_the_expected_moves() -> None:
    assert {(s, t): n for s, moves in TRANSITIONS.items() for t, n in moves.items()} == EXPECTED


def test_a_live_peer_can_only_die_through_suspicion() -> None:
    assert T.CONFIRM not in TRANSITIONS[S.ALIVE]


def full_announcement() -> Announcement:
    return Announcement(
        node_id="a" * 64,
        incarnation=3,
        seq=7,
        version="0.1.0",
        role="worker",
        addresses=("192.168.1.5:7946", "[fe80::1]:7946"),
        api_port=9337,
        console_port=3131,
        models=(ModelEntry("smollm2-135m", "ready"), ModelEntry("qwen", "loading")),
        hardware=Hardware(cores=8, ram_bytes=32 << 30, vram_bytes=24 << 30, usable_bytes=20 << 30),
        queue_depth=2,
        throughput_milli={"smollm2-135m": 95_500},
        rpc=RpcCapacity(free_bytes=4 << 30, device="CUDA0"),
        extra={"zone": "lab", "tags": ["a", 1, None, b"\x00"], "nested": {"k": [True]}},
    )


def test_announcement_wire_round_trip_is_exact_and_cbor_friendly() -> None:
    ann = full_announcement()
    wire = ann.to_wire()
    decoded = cbor2.loads(cbor2.dumps(wire, canonical=True))
    assert decoded == wire
    assert Announcement.from_wire(decoded) == ann
    assert Announcement.from_wire(decoded).to_wire() == wire
    assert ann.throughput == {"smollm2-135m": 95_500}


@pytest.mark.parametrize(
    "change",
    [
        {"node_id": ""},
        {"node_id": "x" * 129},
        {"incarnation": -1},
        {"seq": 1.5},
        {"role": "boss"},
        {"api_port": 70000},
        {"addresses": ["a:1"] * 17},
        {"queue_depth": True},
        {"addresses": ["a"]},
        {"addresses": ["evil host:80"]},
        {"addresses": ["h:0"]},
        {"addresses": ["h:70000"]},
        {"addresses": ["http://h:80"]},
        {"addresses": ["h:80/x y"]},
        {"addresses": ["-h:80"]},
        {"addresses": ["h" * 300 + ":1"]},
        {"throughput_milli": {"m": 2.5}},
        {"extra": {"f": 1.0}},
        {"extra": {1: "x"}},
        {"extra": {"a": {"b": {"c": {"d": {"e": 1}}}}}},
        {"extra": {"big": list(range(300))}},
        {"models": [{"id": "m"}]},
        {"hardware": {"cores": 1}},
        {"version": "bad\nline"},
    ],
)
def test_invalid_announcements_are_refused(change: dict) -> None:
    wire = full_announcement().to_wire() | change
    with pytest.raises(InvalidMessage):
        Announcement.from_wire(wire)


def test_unknown_announcement_keys_are_refused() -> None:
    with pytest.raises(InvalidMessage, match="unknown"):
        Announcement.from_wire(full_announcement().to_wire() | {"later": 1})


def test_record_invariants() -> None:
    ann = Announcement(node_id="p", incarnation=2)
    PeerRecord("p", 2, S.ALIVE, ann)
    PeerRecord("p", 5, S.DEAD, ann)  # a tombstone may keep an older life's announcement
    PeerRecord("p", 5, S.LEFT)
    for bad in (
        lambda: PeerRecord("p", 2, S.ALIVE),
        lambda: PeerRecord("p", 3, S.SUSPECT, ann),
        lambda: PeerRecord("q", 2, S.ALIVE, ann),
        lambda: PeerRecord("p", 1, S.DEAD, ann),
        lambda: PeerRecord("p", 2, S.UNKNOWN, ann),
    ):
        with pytest.raises(InvalidMessage):
            bad()


def messages() -> list:
    ann = full_announcement()
    rec = PeerRecord(ann.node_id, 3, S.SUSPECT, ann)
    view = DigestEntry("b" * 64, 1, S.ALIVE, 4)
    return [
        Ping(1, view, (rec,)),
        Ping(2),
        Ack(3, "b" * 64, (rec,)),
        PingReq(4, "c", view),
        Gossip((rec, PeerRecord("d", 9, S.DEAD))),
        Sync((view, DigestEntry("d", 9, S.DEAD, None)), (rec,)),
        Pull(("a", "b")),
        Leave(12),
    ]


@pytest.mark.parametrize("msg", messages(), ids=lambda m: m.TYPE)
def test_message_wire_round_trip(msg) -> None:
    wire = cbor2.loads(cbor2.dumps(msg.to_wire(), canonical=True))
    assert decode_message(wire) == msg
    assert all(isinstance(k, str) for k in wire)


@pytest.mark.parametrize(
    "wire",
    [
        None,
        [],
        {"type": "nope"},
        {"type": 5},
        {"type": "ping"},
        {"type": "ping", "probe": -1, "view": None, "records": []},
        {"type": "ack", "probe": 1, "subject": "", "records": []},
        {"type": "leave", "inc": "1"},
        {"type": "sync", "digest": [["a", 1, "zombie", 0]], "records": []},
        {"type": "sync", "digest": [["a", 1, "alive"]], "records": []},
        {"type": "gossip", "records": [{"id": "a", "inc": 0, "state": "alive", "ann": None}]},
        {"type": "gossip", "records": [None] * 65},
        {"type": "pull", "ids": "abc"},
        {"type": "leave", "inc": 1, "extra": 2},
    ],
)
def test_malformed_messages_raise_invalid_message(wire) -> None:
    with pytest.raises(InvalidMessage):
        decode_message(wire)


cbor_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.floats(allow_nan=False)
    | st.sampled_from(["ping", "ack", "ping_req", "gossip", "sync", "pull", "leave", "alive"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "probe",
                    "view",
                    "records",
                    "subject",
                    "target",
                    "digest",
                    "ids",
                    "inc",
                    "id",
                    "state",
                    "ann",
                    "node_id",
                ]
            )
            | st.text(max_size=3),
            inner,
            max_size=6,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(cbor_values)
def test_arbitrary_decoded_cbor_gives_a_message_or_invalid_message(wire) -> None:
    try:
        decode_message(wire)
    except InvalidMessage:
        pass


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(messages()), st.data())
def test_mutated_messages_give_a_message_or_invalid_message(msg, data) -> None:
    wire = msg.to_wire()
    key = data.draw(st.sampled_from(sorted(wire)))
    wire[key] = data.draw(cbor_values)
    try:
        decode_message(wire)
    except InvalidMessage:
        pass


def test_config_validation_and_bound() -> None:
    cfg = MembershipConfig()
    assert cfg.detection_bound(0.0, members=10) == pytest.approx(1.0 + 2 * 1.0 + 2.0)
    assert cfg.detection_bound(1.0, members=1000) == pytest.approx(10.0)  # the 1,000-node goal
    assert cfg.suspicion_bounds(100) == pytest.approx((4.0, 24.0))
    with pytest.raises(LocalMembershipError):
        MembershipConfig(probe_timeout=0.8, indirect_timeout=0.8)
    with pytest.raises(LocalMembershipError):
        MembershipConfig(max_piggyback=100)


@pytest.mark.parametrize("addr", ["a.lan:7946", "10.0.0.1:9338", "[fe80::1]:7946", "ws://h:1", "wss://x.y:443/mesh"])
def test_plausible_addresses_are_accepted(addr: str) -> None:
    from hydra_node.mesh.membership.announcement import address

    assert address(addr) == addr
