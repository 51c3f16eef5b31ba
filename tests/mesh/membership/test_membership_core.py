"""The membership core, driven by hand: a few cores wired back to back in memory."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from hydra_node.mesh.membership import (
    Ack,
    Announcement,
    Gossip,
    Leave,
    LocalMembershipError,
    Membership,
    MembershipConfig,
    ModelEntry,
    PeerDied,
    PeerJoined,
    PeerRecord,
    PeerRecovered,
    PeerState,
    PeerSuspected,
    PeerUpdated,
    Ping,
    PingReq,
    Pull,
    Send,
    Sync,
)
from hydra_node.mesh.membership.sim import SimNetwork

CFG = MembershipConfig()
S = PeerState


class Wire:
    """Cores delivering to each other instantly; `dead` nodes neither send nor receive."""

    def __init__(self, *ids: str, config: MembershipConfig = CFG) -> None:
        self.cores = {
            i: Membership(
                Announcement(node_id=i, addresses=(f"{i}.lan:7946",), models=(ModelEntry("m", "ready"),)),
                config,
                random.Random(i),
                now=0.0,
            )
            for i in ids
        }
        self.events: dict[str, list] = {i: [] for i in ids}
        self.sent: list[tuple[str, Send]] = []
        self.dead: set[str] = set()
        self.queue: list[tuple[str, Send]] = []

    def feed(self, node: str, actions: list) -> None:
        for a in actions:
            if isinstance(a, Send):
                self.sent.append((node, a))
                if node not in self.dead:
                    self.queue.append((node, a))
            else:
                self.events[node].append(a)

    def flush(self, now: float) -> None:
        for _ in range(10_000):
            if not self.queue:
                return
            sender, send = self.queue.pop(0)
            if send.to in self.cores and send.to not in self.dead:
                self.feed(send.to, self.cores[send.to].on_message(sender, send.message.to_wire(), now))
        raise AssertionError("messages never stopped")

    def run_until(self, end: float, start: float = 0.0) -> None:
        """Tick every live core at its deadlines up to `end`."""
        now = start
        while True:
            live = [i for i in self.cores if i not in self.dead]
            now = min(self.cores[i].next_deadline() for i in live)
            if now > end:
                return
            for i in live:
                if self.cores[i].next_deadline() <= now:
                    self.feed(i, self.cores[i].tick(now))
            self.flush(now)

    def joined(self, now: float = 0.0) -> Wire:
        first, *rest = self.cores
        for i in rest:
            self.feed(i, self.cores[i].join([first]))
        self.flush(now)
        return self

    def first(self, node: str, kind: type, peer: str):
        return next((e for e in self.events[node] if isinstance(e, kind) and e.peer_id == peer), None)


def test_join_exchanges_announcements_both_ways() -> None:
    w = Wire("a", "b", "c").joined()
    for x in w.cores:
        assert sorted(w.cores[x].members()) == sorted(set(w.cores) - {x})
        joined = {e.peer_id: e.announcement for e in w.events[x] if isinstance(e, PeerJoined)}
        assert joined == {y: w.cores[y].announcement for y in w.cores if y != x}


def test_local_update_stamps_seq_and_reaches_peers_at_once() -> None:
    w = Wire("a", "b").joined()
    a = w.cores["a"]
    w.feed("a", a.local_update(replace(a.announcement, queue_depth=5, incarnation=99, seq=0)))
    w.flush(0.1)
    assert (a.announcement.incarnation, a.announcement.seq, a.announcement.queue_depth) == (0, 1, 5)
    update = w.first("b", PeerUpdated, "a")
    assert update is not None and update.announcement.queue_depth == 5
    with pytest.raises(LocalMembershipError):
        a.local_update(Announcement(node_id="b"))


def test_silent_peer_goes_direct_probe_then_ping_req_then_suspect_then_dead() -> None:
    w = Wire("a", "b", "c").joined()
    w.run_until(5.0)
    w.dead.add("c")
    w.sent.clear()
    w.run_until(20.0, start=5.0)
    suspect, died = w.first("a", PeerSuspected, "c"), w.first("a", PeerDied, "c")
    assert suspect is not None and died is not None
    kinds = [type(s.message) for n, s in w.sent if n == "a" and s.to in ("b", "c")]
    assert Ping in kinds and PingReq in kinds
    assert [s.to for n, s in w.sent if n == "a" and isinstance(s.message, PingReq)][0] == "b"
    assert w.cores["a"].state_of("c") is S.DEAD and w.cores["b"].state_of("c") is S.DEAD
    assert w.first("a", PeerDied, "b") is None


def test_detection_timeline_matches_the_config() -> None:
    w = Wire("a", "b").joined()
    w.run_until(5.0)
    w.dead.add("b")
    times = {}
    now = 5.0
    core = w.cores["a"]
    while now < 20.0 and "dead" not in times:
        now = core.next_deadline()
        for e in core.tick(now):
            if isinstance(e, PeerSuspected):
                times["suspect"] = now
            if isinstance(e, PeerDied):
                times["dead"] = now
    worst_first_probe = CFG.probe_interval
    assert times["suspect"] - 5.0 <= worst_first_probe + CFG.probe_timeout + CFG.indirect_timeout
    # two nodes: nobody else can confirm, so the suspicion lasts its minimum, stretched by our
    # local health: the failed probe had no helper to nack, which counts once against us (x2)
    assert core.health.score == 1
    assert times["dead"] - times["suspect"] == pytest.approx(CFG.suspicion_bounds(2)[0] * 2)


def test_death_claim_is_verified_and_the_victim_refutes() -> None:
    w = Wire("a", "b", "c").joined()
    w.run_until(3.0)
    claim = PeerRecord("b", 0, S.DEAD)
    actions = w.cores["a"].on_message("c", Gossip((claim,)).to_wire(), 3.0)
    assert any(isinstance(e, PeerSuspected) and e.peer_id == "b" for e in actions)
    assert not any(isinstance(e, PeerDied) for e in actions)
    pings = [s for s in actions if isinstance(s, Send) and s.to == "b" and isinstance(s.message, Ping)]
    assert pings and pings[0].message.view.state is S.SUSPECT  # b learns it is suspected
    w.feed("a", actions)
    w.flush(3.0)
    assert w.cores["b"].incarnation == 1
    assert w.first("a", PeerRecovered, "b") is not None
    assert w.cores["a"].state_of("b") is S.ALIVE
    w.run_until(15.0, start=3.0)
    assert all(w.first(x, PeerDied, "b") is None for x in w.cores)


def test_death_claim_with_our_own_failed_probe_is_acted_on_without_waiting() -> None:
    w = Wire("a", "b", "c").joined()
    w.run_until(3.0)
    w.dead.add("b")
    w.feed("a", w.cores["a"].on_message("c", Gossip((PeerRecord("b", 0, S.DEAD),)).to_wire(), 3.0))
    w.flush(3.0)
    now = 3.0
    while w.first("a", PeerDied, "b") is None:
        now = w.cores["a"].next_deadline()
        w.feed("a", w.cores["a"].tick(now))
        w.flush(now)
    assert now - 3.0 <= CFG.probe_timeout + CFG.indirect_timeout < CFG.suspicion_bounds(3)[0]


def test_suspicion_of_ourselves_is_refuted_with_a_higher_incarnation() -> None:
    w = Wire("a", "b").joined()
    a = w.cores["a"]
    lie = PeerRecord("a", 0, S.SUSPECT, a.announcement)
    actions = a.on_message("b", Gossip((lie,)).to_wire(), 1.0)
    assert a.incarnation == 1 and a.statistics(1.0).refutations == 1
    pushed = [r for s in actions if isinstance(s, Send) for r in getattr(s.message, "records", ())]
    assert PeerRecord("a", 1, S.ALIVE, a.announcement) in pushed


def test_leave_tells_every_member_and_then_ignores_input() -> None:
    w = Wire("a", "b", "c").joined()
    a = w.cores["a"]
    actions = a.leave()
    assert sorted(s.to for s in actions if isinstance(s.message, Leave)) == ["b", "c"]
    assert a.leave() == [] and a.next_deadline() == float("inf")
    assert a.on_message("b", Ping(1).to_wire(), 1.0) == []
    assert a.statistics(1.0).ignored["after_leave"] == 1
    with pytest.raises(LocalMembershipError):
        a.local_update(a.announcement)
    w.feed("a", actions)
    w.flush(1.0)
    assert w.cores["b"].state_of("a") is S.LEFT and w.cores["c"].state_of("a") is S.LEFT


def test_untrusted_input_is_counted_never_raised() -> None:
    a = Wire("a").cores["a"]
    assert a.on_message("x", {"type": "ping"}, 1.0) == []
    assert a.on_message("x", b"\x00garbage", 1.0) == []  # type: ignore[arg-type]
    assert a.on_message("a", Ping(1).to_wire(), 1.0) == []
    assert a.on_message("x", Ack(77, "x").to_wire(), 1.0) == []
    stats = a.statistics(1.0)
    assert stats.rejected == {"invalid": 2, "bad_sender": 1}
    assert stats.ignored == {"unmatched_ack": 1}


def test_max_peers_bounds_the_table_and_evicts_tombstones_first() -> None:
    cfg = MembershipConfig(max_peers=3)
    a = Membership(Announcement(node_id="a"), cfg, random.Random(1))
    recs = tuple(PeerRecord(f"p{i}", 0, S.ALIVE, Announcement(node_id=f"p{i}")) for i in range(5))
    a.on_message("p0", Gossip((PeerRecord("t", 2, S.DEAD), *recs[:2])).to_wire(), 1.0)
    assert sorted(a.members()) == ["p0", "p1"] and a.state_of("t") is S.DEAD  # table full
    a.on_message("p0", Gossip(recs[2:]).to_wire(), 2.0)
    assert sorted(a.members()) == ["p0", "p1", "p2"] and a.state_of("t") is S.UNKNOWN
    assert a.statistics(2.0).rejected["over_max_peers"] == 2


def test_messages_respect_the_record_bounds() -> None:
    cfg = MembershipConfig(max_piggyback=4, max_records_per_message=5)
    a = Membership(Announcement(node_id="a"), cfg, random.Random(1))
    recs = [PeerRecord(f"p{i:02d}", 0, S.ALIVE, Announcement(node_id=f"p{i:02d}")) for i in range(23)]
    out = []
    for i in range(0, 23, 8):
        out += a.on_message("p00", Gossip(tuple(recs[i : i + 8])).to_wire(), 1.0)
    out += a.on_message("p00", Sync(()).to_wire(), 1.0)
    out += a.tick(1.2) + a.on_message("p01", Ping(5).to_wire(), 1.3)
    sends = [s.message for s in out if isinstance(s, Send)]
    gossip = [m for m in sends if isinstance(m, Gossip)]
    assert sum(len(m.records) for m in gossip if len(m.records) == 5) >= 20  # the Sync answer, chunked
    assert all(len(m.records) <= 5 for m in gossip)
    assert all(len(m.records) <= 4 for m in sends if isinstance(m, (Ping, Ack, PingReq)))


def test_statistics_show_peers_and_message_counts() -> None:
    w = Wire("a", "b").joined()
    w.run_until(4.0)
    stats = w.cores["a"].statistics(4.5)
    (peer,) = stats.peers
    assert (peer.peer_id, peer.state, peer.incarnation, peer.role) == ("b", "alive", 0, "host")
    assert peer.addresses == ("b.lan:7946",) and peer.models == (("m", "ready"),)
    assert peer.last_seen_s is not None and 0 <= peer.last_seen_s <= 1.5
    assert stats.sent["ping"] >= 3 and stats.received["ack"] >= 3 and stats.count("alive") == 1


def test_link_hints() -> None:
    w = Wire("a", "b").joined()
    a = w.cores["a"]
    pings = [s for s in a.link_down("b", 1.0) if isinstance(s.message, Ping)]
    assert [s.to for s in pings] == ["b"]
    assert a.link_down("b", 1.1) == []  # already probing
    assert [type(s.message) for s in a.link_up("z", 1.2)] == [Sync]
    assert a.link_up("b", 1.2) == []


def test_unknown_pinger_is_answered_and_pulled() -> None:
    a = Wire("a").cores["a"]
    out = a.on_message("z", Ping(9).to_wire(), 1.0)
    assert [(s.to, type(s.message)) for s in out] == [("z", Ack), ("z", Pull)]
    assert out[0].message.probe_id == 9 and out[0].message.subject == "a"


def test_simulation_is_deterministic_for_a_seed() -> None:
    def run() -> list:
        net = SimNetwork(seed=5, loss=0.02)
        for i in range(6):
            net.add_node(f"n{i}", seeds=[] if i == 0 else ["n0"])
        net.run_for(5)
        net.kill("n2")
        net.run_for(10)
        return net.log

    assert run() == run()


def test_a_claim_far_above_what_the_victim_announced_is_rejected_and_counted() -> None:
    """A member cannot poison another's incarnation (issue 14 item 4): the victim stays alive."""
    from hydra_node.mesh.membership.changes import MAX_CLAIMED_INCARNATION, MAX_INCARNATION_LEAD

    w = Wire("a", "b", "c").joined()
    w.run_until(3.0)
    a = w.cores["a"]
    for inc in (2**63 - 1, MAX_CLAIMED_INCARNATION + 1, MAX_INCARNATION_LEAD + 1):
        actions = a.on_message("c", Gossip((PeerRecord("b", inc, S.DEAD),)).to_wire(), 3.0)
        assert not any(isinstance(e, (PeerSuspected, PeerDied)) for e in actions)
    assert a.state_of("b") is S.ALIVE
    assert a.statistics(3.0).rejected == {"incarnation_over_cap": 2, "incarnation_beyond_announced": 1}
    # a claim within reach of what b signed is still acted on (suspect, then b refutes)
    actions = a.on_message("c", Gossip((PeerRecord("b", MAX_INCARNATION_LEAD, S.DEAD),)).to_wire(), 3.0)
    assert any(isinstance(e, PeerSuspected) and e.peer_id == "b" for e in actions)


def test_refuting_the_highest_allowed_claim_about_us_succeeds_within_the_field() -> None:
    from hydra_node.mesh.membership.changes import MAX_CLAIMED_INCARNATION

    w = Wire("a", "b").joined()
    a = w.cores["a"]
    a.on_message("b", Gossip((PeerRecord("a", MAX_CLAIMED_INCARNATION, S.DEAD),)).to_wire(), 1.0)
    assert a.incarnation == MAX_CLAIMED_INCARNATION + 1 < 2**63 - 1  # the announcement still validates
    a.on_message("b", Gossip((PeerRecord("a", 2**63 - 1, S.DEAD),)).to_wire(), 1.0)
    assert a.incarnation == MAX_CLAIMED_INCARNATION + 1 and a.statistics(1.0).rejected == {"incarnation_over_cap": 1}
