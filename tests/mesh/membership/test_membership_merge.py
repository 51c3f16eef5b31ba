"""Property tests of the merge rule: a join semilattice over (incarnation, state, announcement)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hydra_node.mesh.membership import Announcement, PeerRecord, PeerState, merge_records

S = PeerState


@st.composite
def records(draw) -> PeerRecord:
    inc = draw(st.integers(0, 3))
    state = draw(st.sampled_from([S.ALIVE, S.SUSPECT, S.DEAD, S.LEFT]))
    ann_inc = inc if state.is_member else draw(st.integers(0, inc))
    # queue_depth varies content at equal (incarnation, seq): a buggy or lying peer
    ann = Announcement(
        node_id="peer", incarnation=ann_inc, seq=draw(st.integers(0, 3)), queue_depth=draw(st.integers(0, 2))
    )
    if not state.is_member and draw(st.booleans()):
        ann = None
    return PeerRecord("peer", inc, state, ann)


def ann_key(rec: PeerRecord) -> tuple[int, int]:
    a = rec.announcement
    return (-1, -1) if a is None else (a.incarnation, a.seq)


merge_settings = settings(max_examples=300, deadline=None)


@merge_settings
@given(records(), records())
def test_commutative(a: PeerRecord, b: PeerRecord) -> None:
    assert merge_records(a, b) == merge_records(b, a)


@merge_settings
@given(records(), records(), records())
def test_associative(a: PeerRecord, b: PeerRecord, c: PeerRecord) -> None:
    assert merge_records(merge_records(a, b), c) == merge_records(a, merge_records(b, c))


@merge_settings
@given(records())
def test_idempotent(a: PeerRecord) -> None:
    assert merge_records(a, a) == a


@merge_settings
@given(records(), records())
def test_monotone_in_incarnation_and_state_precedence(a: PeerRecord, b: PeerRecord) -> None:
    m = merge_records(a, b)
    assert m.status == max(a.status, b.status)
    assert ann_key(m) == max(ann_key(a), ann_key(b))
    assert merge_records(m, a) == m and merge_records(m, b) == m  # m is an upper bound


@merge_settings
@given(records(), records())
def test_result_is_a_valid_record_from_the_inputs(a: PeerRecord, b: PeerRecord) -> None:
    m = merge_records(a, b)
    assert (m.incarnation, m.state) in {(a.incarnation, a.state), (b.incarnation, b.state)}
    assert m.announcement in (a.announcement, b.announcement)


def test_stale_alive_never_beats_a_tombstone_of_the_same_life() -> None:
    ann = Announcement(node_id="peer", incarnation=4, seq=9)
    dead = PeerRecord("peer", 4, S.DEAD)
    assert merge_records(dead, PeerRecord("peer", 4, S.ALIVE, ann)).state is S.DEAD
    newer = Announcement(node_id="peer", incarnation=5)
    assert merge_records(dead, PeerRecord("peer", 5, S.ALIVE, newer)).state is S.ALIVE
