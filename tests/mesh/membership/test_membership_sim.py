"""Whole-mesh behaviour of the membership core on the deterministic simulated network."""

from __future__ import annotations

import pytest

from hydra_node.mesh.membership import (
    Gossip,
    Leave,
    MembershipConfig,
    PeerDied,
    PeerJoined,
    PeerLeft,
    PeerRecord,
    PeerState,
)
from hydra_node.mesh.membership.sim import LanDelay, SimNetwork

ALIVE, SUSPECT, DEAD, LEFT = PeerState.ALIVE, PeerState.SUSPECT, PeerState.DEAD, PeerState.LEFT
BOUND = MembershipConfig().detection_bound(dissemination=1.0)


def names(n: int) -> list[str]:
    return [f"node-{i:02d}" for i in range(n)]


def mesh(n: int, *, seed: int = 1, loss: float = 0.0, settle: float = 3.0) -> SimNetwork:
    """n nodes joining through the first, 50 ms apart, then left to settle."""
    net = SimNetwork(seed=seed, loss=loss)
    ids = names(n)
    net.add_node(ids[0])
    for node in ids[1:]:
        net.run_for(0.05)
        net.add_node(node, seeds=[ids[0]])
    assert net.run_for(30, until=net.full_view) is not None, "mesh did not converge"
    net.run_for(settle)
    return net


def false_deaths(net: SimNetwork, allowed: set[str]) -> list:
    return [e for e in net.events_of(PeerDied) if e[2].peer_id not in allowed]


def test_default_bound_is_under_ten_seconds() -> None:
    assert BOUND <= 10.0


@pytest.mark.parametrize("n", [5, 30])
def test_joins_converge_to_a_full_view_with_announcements(n: int) -> None:
    net = mesh(n, seed=n)
    for a in net.nodes:
        members = net.nodes[a].members()
        assert sorted(members) == sorted(set(net.nodes) - {a})
        for b, ann in members.items():
            assert ann == net.nodes[b].announcement
    assert not net.events_of(PeerDied)


@pytest.mark.parametrize("n", [5, 30])
def test_kill_is_detected_by_every_node_within_the_bound(n: int) -> None:
    net = mesh(n, seed=100 + n)
    victim = names(n)[n // 2]
    killed_at = net.now
    net.kill(victim)
    seen = net.run_for(30, until=lambda: net.all_see(victim, (DEAD,)))
    assert seen is not None
    assert seen - killed_at <= BOUND
    died = net.events_of(PeerDied, victim)
    assert {node for _, node, _ in died} == set(net.live())
    assert all(t - killed_at <= BOUND for t, _, _ in died)
    assert not false_deaths(net, {victim})


def test_detection_under_loss_without_false_deaths() -> None:
    net = mesh(10, seed=7, loss=0.05)
    net.run_for(30)  # steady state with 5 % loss: suspicions may happen, deaths must not
    assert not false_deaths(net, set())
    victim = "node-04"
    killed_at = net.now
    net.kill(victim)
    seen = net.run_for(30, until=lambda: net.all_see(victim, (DEAD,)))
    assert seen is not None and seen - killed_at <= BOUND
    assert not false_deaths(net, {victim})


@pytest.mark.parametrize("claim", [DEAD, SUSPECT, LEFT])
def test_a_single_false_reporter_cannot_evict_a_live_node(claim: PeerState) -> None:
    net = mesh(6, seed=11)
    liar, victim = "node-01", "node-03"
    for _ in range(20):  # the liar repeats its claim every second, to everyone but the victim
        rec = net.nodes[liar].record(victim)
        lie = PeerRecord(victim, rec.incarnation, claim, rec.announcement if claim is SUSPECT else None)
        for node in net.live():
            if node not in (liar, victim):
                net.send_as(liar, node, Gossip((lie,)))
        net.run_for(1.0)
    net.run_for(2.0)
    assert not net.events_of(PeerDied, victim) and not net.events_of(PeerLeft, victim)
    assert net.all_see(victim, (ALIVE,))


def test_a_leave_only_ever_removes_its_sender() -> None:
    net = mesh(5, seed=12)
    net.send_as("node-01", "node-02", Leave(0))  # a leave removes its sender...
    net.run_for(0.1)
    assert [e[2].peer_id for e in net.events_of(PeerLeft)] == ["node-01"]
    assert net.state("node-02", "node-03") is ALIVE
    # ...and node-01, in fact alive, is told and refutes with a higher incarnation
    assert net.run_for(5, until=net.full_view) is not None
    assert net.nodes["node-01"].incarnation == 1
    forged = PeerRecord("node-03", net.nodes["node-03"].incarnation, LEFT)
    net.send_as("node-01", "node-02", Gossip((forged,)))  # a relayed leave is only a claim
    net.run_for(5.0)
    assert net.all_see("node-03", (ALIVE,))
    assert not net.events_of(PeerLeft, "node-03")


def test_partition_then_heal_converges_back() -> None:
    net = mesh(6, seed=21)
    left, right = names(6)[:3], names(6)[3:]
    net.partition(left, right)
    # a node whose ring monitor is on its own side is found by round-robin probes: no fixed bound
    both_dead = net.run_for(
        30, until=lambda: all(net.state(a, b) is DEAD and net.state(b, a) is DEAD for a in left for b in right)
    )
    assert both_dead is not None
    assert net.full_view(left) and net.full_view(right)
    net.heal()
    healed = net.run_for(60, until=net.full_view)
    assert healed is not None
    assert all(net.nodes[n].incarnation >= 1 for n in net.nodes)  # each side refuted its death


def test_tombstone_stops_stale_gossip_resurrecting_a_dead_node() -> None:
    net = mesh(5, seed=31)
    victim = "node-02"
    stale = net.nodes["node-00"].record(victim)
    assert stale.state is ALIVE
    net.kill(victim)
    assert net.run_for(30, until=lambda: net.all_see(victim, (DEAD,))) is not None
    dead_at = net.now
    for node in net.live():  # a lagging peer replays the old alive record to everyone
        if node != "node-01":
            net.send_as("node-01", node, Gossip((stale,)))
    net.run_for(3.0)
    assert net.all_see(victim, (DEAD,))
    assert not [e for e in net.events_of(PeerJoined, victim) if e[0] > dead_at]


@pytest.mark.parametrize("incarnation", [1, 0])
def test_restart_rejoins_with_a_higher_incarnation(incarnation: int) -> None:
    net = mesh(5, seed=41)
    victim = "node-03"
    net.kill(victim)
    assert net.run_for(30, until=lambda: net.all_see(victim, (DEAD,))) is not None
    restarted_at = net.now
    core = net.restart(victim, incarnation=incarnation, seeds=["node-00"])
    assert net.run_for(10, until=net.full_view) is not None
    assert core.incarnation >= 1  # a restart at the old incarnation is pushed past its tombstone
    rejoined = [e for e in net.events_of(PeerJoined, victim) if e[0] >= restarted_at]
    assert {node for _, node, _ in rejoined} == set(net.live()) - {victim}


def test_clean_leave_is_seen_quickly_and_is_not_a_death() -> None:
    net = mesh(8, seed=51)
    leaver = "node-05"
    left_at = net.now
    net.leave(leaver)
    seen = net.run_for(5, until=lambda: net.all_see(leaver, (LEFT,)), check_every=0.01)
    assert seen is not None and seen - left_at <= 0.05
    assert not net.events_of(PeerDied, leaver)
    net.run_for(BOUND)
    assert net.all_see(leaver, (LEFT,))


def test_tombstones_expire_after_their_ttl() -> None:
    config = MembershipConfig(tombstone_ttl=20.0)
    net = SimNetwork(seed=61, config=config, delay=LanDelay(0.001, 0.001))
    for i, node in enumerate(names(4)):
        net.add_node(node, seeds=[] if i == 0 else ["node-00"])
    assert net.run_for(10, until=net.full_view) is not None
    net.kill("node-03")
    net.run_for(10)
    assert net.all_see("node-03", (DEAD,))
    net.run_for(25)
    assert net.all_see("node-03", (PeerState.UNKNOWN,))
