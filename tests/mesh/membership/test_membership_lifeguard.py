"""Lifeguard in the membership core: local health, nacks, confirmations (sans-IO, no clock)."""

from __future__ import annotations

import random

import pytest

from hydra_node.mesh.membership import (
    Ack,
    Announcement,
    Gossip,
    InvalidMessage,
    Membership,
    MembershipConfig,
    PeerRecord,
    PeerState,
    PeerSuspected,
    Ping,
    PingReq,
    Send,
    decode_message,
)
from hydra_node.mesh.membership.health import LocalHealth
from hydra_node.mesh.membership.messages import Nack, Suspect
from hydra_node.mesh.membership.suspicion import Suspicion, suspicion_timeout

CFG = MembershipConfig()
#: Periodic probes, syncs and reconnects far apart, so a test starts each probe itself (link_down).
QUIET = MembershipConfig(probe_interval=1000.0, sync_interval=1000.0, reconnect_interval=1000.0)


def core(node: str, peers: list[str], *, now: float = 0.0) -> Membership:
    """A quiet core that already knows `peers` alive (told by the first of them)."""
    m = Membership(Announcement(node_id=node, addresses=(f"{node}.lan:1",)), QUIET, random.Random(node), now=now)
    records = tuple(
        PeerRecord(p, 0, PeerState.ALIVE, Announcement(node_id=p, addresses=(f"{p}.lan:1",))) for p in peers
    )
    for i in range(0, len(records), 16):
        m.on_message(peers[0], Gossip(records[i : i + 16]).to_wire(), now)
    assert sorted(m.members()) == sorted(peers)
    return m


def sends(actions: list, kind: type) -> list[Send]:
    return [a for a in actions if isinstance(a, Send) and isinstance(a.message, kind)]


def run_until(m: Membership, end: float, now: float) -> tuple[list, float]:
    out = []
    while (t := m.next_deadline()) <= end:
        now = t
        out += m.tick(now)
    return out, now


# ---------------------------------------------------------------- pure parts


def test_local_health_clamps_scales_and_rate_limits_lag() -> None:
    h = LocalHealth(max_multiplier=3, lag_threshold=0.25, lag_window=1.0)
    assert (h.score, h.scale(0.5)) == (0, 0.5)
    assert h.apply(5) == 2 and h.scale(0.5) == pytest.approx(1.5)
    assert h.apply(-9) == 0 and (h.raised, h.lowered) == (2, 2)
    assert not h.note_lag(0.2, now=10.0)  # below the threshold
    assert h.note_lag(0.3, now=10.0) and h.score == 1
    assert not h.note_lag(2.0, now=10.5)  # once per window
    assert h.note_lag(float("inf"), now=11.0) and h.score == 2
    assert not h.note_lag(float("nan"), now=20.0)
    with pytest.raises(ValueError):
        LocalHealth(max_multiplier=0)


def test_suspicion_shrinks_log_wise_with_independent_confirmations() -> None:
    assert suspicion_timeout(0, 2, 2.0, 12.0) == 12.0
    assert suspicion_timeout(1, 2, 2.0, 12.0) == pytest.approx(12.0 - 10.0 * 0.6309, abs=1e-3)
    assert suspicion_timeout(2, 2, 2.0, 12.0) == 2.0
    assert suspicion_timeout(0, 0, 2.0, 12.0) == 2.0  # too few nodes to confirm: the minimum
    s = Suspicion(start=5.0, low=2.0, high=12.0, expected=2, origin="x")
    assert s.deadline == 17.0
    assert not s.confirm("x")  # the origin is not an independent confirmation
    assert s.confirm("y") and not s.confirm("y")
    assert s.confirm("z") and s.deadline == 7.0
    assert CFG.suspicion_bounds(1000) == pytest.approx((6.0, 36.0))


def test_lifeguard_messages_round_trip_and_reject_bad_input() -> None:
    for msg in (Nack(7), Suspect("b", 3)):
        assert decode_message(msg.to_wire()) == msg
    for bad in (
        {"type": "nack", "probe": -1},
        {"type": "nack", "probe": 1, "x": 0},
        {"type": "suspect", "target": "", "inc": 1},
        {"type": "suspect", "target": "b"},
    ):
        with pytest.raises(InvalidMessage):
            decode_message(bad)


# ---------------------------------------------------------------- nacks and local health


def test_a_helper_nacks_when_the_target_is_silent_and_not_when_it_acks() -> None:
    helper = core("h", ["a", "t"])
    out = helper.on_message("a", PingReq(41, "t").to_wire(), 10.0)
    ping = sends(out, Ping)[0]
    assert ping.to == "t"
    due = 10.0 + 0.8 * CFG.indirect_timeout
    assert helper.next_deadline() <= due
    nacks = sends(helper.tick(due), Nack)
    assert [(s.to, s.message.probe_id) for s in nacks] == [("a", 41)]
    assert not sends(helper.tick(due + 0.01), Nack)  # once
    # a second request whose target answers in time: no nack, the ack is forwarded
    out = helper.on_message("a", PingReq(42, "t").to_wire(), 20.0)
    pid = sends(out, Ping)[0].message.probe_id
    fwd = sends(helper.on_message("t", Ack(pid, "t").to_wire(), 20.1), Ack)
    assert [(s.to, s.message.probe_id) for s in fwd] == [("a", 42)]
    assert not sends(helper.tick(20.0 + CFG.indirect_timeout), Nack)


def test_failed_probes_without_nacks_raise_health_and_stretch_the_next_timeouts() -> None:
    m = core("a", ["b", "c", "d", "e"])
    m.link_down("b", 10.0)  # starts a probe of b now
    assert m.health.score == 0
    out, now = run_until(m, 10.0 + CFG.probe_timeout, 10.0)
    helpers = [s.to for s in sends(out, PingReq)]
    assert len(helpers) == 3
    m.on_message(helpers[0], Nack(sends(out, PingReq)[0].message.probe_id).to_wire(), now + 0.1)
    run_until(m, now + CFG.indirect_timeout, now)
    assert m.health.score == 2  # three helpers asked, one nacked: two missed nacks
    assert m.statistics(now).local_health == 2
    m.link_down("c", 20.0)
    out, _ = run_until(m, 20.0 + 3 * CFG.probe_timeout - 0.01, 20.0)
    assert not [s for s in sends(out, PingReq) if s.message.target == "c"]  # direct timeout now 3 x 0.5 s
    out, _ = run_until(m, 20.0 + 3 * CFG.probe_timeout, 20.0)
    assert [s for s in sends(out, PingReq) if s.message.target == "c"]


def test_successful_probes_lower_health_and_refuting_raises_it() -> None:
    m = core("a", ["b", "c"])
    m.health.apply(3)
    out = m.link_down("b", 5.0)
    ping = sends(out, Ping)[0].message
    m.on_message("b", Ack(ping.probe_id, "b").to_wire(), 5.01)
    assert m.health.score == 2
    lie = PeerRecord("a", 0, PeerState.SUSPECT, m.announcement)
    m.on_message("b", Gossip((lie,)).to_wire(), 6.0)
    assert m.incarnation == 1 and m.health.score == 3


def test_note_local_lag_counts_significant_lag_only() -> None:
    m = core("a", ["b"])
    m.note_local_lag(0.01, 1.0)
    assert m.health.score == 0
    m.note_local_lag(CFG.lag_threshold, 2.0)
    m.note_local_lag(5.0, 2.1)  # rate-limited to one point per probe interval
    assert m.health.score == 1


# ---------------------------------------------------------------- confirmations


def test_confirmations_shorten_a_suspicion_to_its_minimum() -> None:
    peers = [f"p{i}" for i in range(9)]
    m = core("a", peers)
    low, high = QUIET.suspicion_bounds(10)
    out = m.on_message("p1", Gossip((PeerRecord("p0", 0, PeerState.SUSPECT, m.members()["p0"]),)).to_wire(), 1.0)
    assert any(isinstance(e, PeerSuspected) for e in out)
    assert m.next_deadline() < 1.0 + high  # our own probe of p0 runs first
    assert m._suspicions["p0"].deadline == pytest.approx(1.0 + high)
    m.on_message("p1", Suspect("p0", 0).to_wire(), 1.5)  # the origin again: not independent
    m.on_message("p2", Suspect("p0", 0).to_wire(), 1.6)
    assert 1.0 + low < m._suspicions["p0"].deadline < 1.0 + high
    m.on_message("p3", Suspect("p0", 0).to_wire(), 1.7)
    assert m._suspicions["p0"].deadline == pytest.approx(1.0 + low)
    m.on_message("p0", Ping(9, None).to_wire(), 2.0)  # p0 is alive: its refutation will clear it


def test_a_suspect_message_starts_a_suspicion_or_a_refutation() -> None:
    m = core("a", ["b", "c", "d"])
    out = m.on_message("c", Suspect("b", 0).to_wire(), 1.0)
    assert m.state_of("b") is PeerState.SUSPECT and sends(out, Ping)[0].to == "b"
    m.on_message("c", Suspect("d", 7).to_wire(), 1.0)  # another life than we know: ignored
    assert m.state_of("d") is PeerState.ALIVE and m.statistics(1.0).ignored["stale_suspect"] == 1
    m.on_message("c", Suspect("a", 0).to_wire(), 1.0)
    assert m.incarnation == 1


def test_own_failed_probe_tells_fanout_members_first_hand() -> None:
    m = core("a", ["b", "c", "d", "e", "f"])
    m.link_down("b", 1.0)
    out, _ = run_until(m, 1.0 + CFG.probe_timeout + CFG.indirect_timeout, 1.0)
    told = sends(out, Suspect)
    assert len(told) == CFG.gossip_fanout and all(s.message.target == "b" and s.to != "b" for s in told)
