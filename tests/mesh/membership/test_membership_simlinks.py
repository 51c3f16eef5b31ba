"""The simulator's link model (latency, NAT and relays, slow hosts) and the bounded anti-entropy."""

from __future__ import annotations

import random

import cbor2
import pytest

from hydra_node.mesh.membership import (
    Announcement,
    Gossip,
    Membership,
    MembershipConfig,
    ModelEntry,
    PeerDied,
    PeerRecord,
    PeerState,
    Ping,
    Pull,
    Send,
)
from hydra_node.mesh.membership.antientropy import bucket_count
from hydra_node.mesh.membership.messages import DigestSync
from hydra_node.mesh.membership.sim import HostProfile, SimNetwork, WanDelay
from hydra_node.mesh.membership.simlinks import MAX_SPIKE_S, cbor_size


def test_cbor_size_is_the_encoded_length() -> None:
    ann = Announcement(
        node_id="é" * 3 + "a" * 61,
        incarnation=5,
        addresses=("10.0.0.1:7946",),
        models=(ModelEntry("m", "ready"),),
        extra={"sig": bytes(64), "n": -300},
    )
    for wire in (
        Ping(2**40, None, (PeerRecord(ann.node_id, 5, PeerState.ALIVE, ann),)).to_wire(),
        DigestSync(4, (1, 2**32 - 1, 0, 70000)).to_wire(),
        {"x": [None, True, -1, 23, 24, 2**33]},
    ):
        assert cbor_size(wire) == len(cbor2.dumps(wire, canonical=True))


def test_wan_delay_grows_with_distance_and_spikes_are_capped() -> None:
    wan = WanDelay()
    assert wan.base(0.1, 0.1) == wan.near and wan.base(0.0, 0.5) == pytest.approx(wan.far)
    assert wan.base(0.0, 0.9) == pytest.approx(wan.base(0.0, 0.1))  # sites sit on a ring
    rng = random.Random(1)
    spiky = WanDelay(spike_p=1.0, spike_scale=10.0)
    samples = [spiky.sample(rng, 0.0, 0.5) for _ in range(200)]
    assert all(0 < s <= spiky.far * 5 + MAX_SPIKE_S for s in samples)


def ids(n: int) -> list[str]:
    return [f"n{i:02d}" for i in range(n)]


def test_a_nated_host_is_reached_through_its_relay_until_it_dials_out() -> None:
    net = SimNetwork(seed=3)
    a, relay, nat, other = ids(4)
    net.add_node(a)
    net.add_node(relay, seeds=[a])
    net.add_node(other, seeds=[a])
    net.run_for(1.0)
    net.add_node(nat, seeds=[relay], profile=HostProfile(nat=True, relays=(relay,)))
    net.add_node("nat2", seeds=[a], profile=HostProfile(nat=True, relays=(relay,)))
    assert net.run_for(10, until=net.converged) is not None
    net.run_for(10)  # every member probes every other within a few round-robin periods
    assert net.relayed[relay] > 0  # two NATed hosts can only talk through the relay
    assert net.unreachable == 0
    # a NATed host without a relay that nobody has heard from is unreachable
    net.add_node("lonely", profile=HostProfile(nat=True))
    net.send_as(a, "lonely", Pull(("lonely",)))
    assert net.unreachable == 1


def test_the_mesh_stays_whole_when_a_relay_dies_and_the_nated_host_has_another() -> None:
    net = SimNetwork(seed=4)
    names = ids(6)
    net.add_node(names[0])
    for n in names[1:4]:
        net.add_node(n, seeds=[names[0]])
    for n in names[4:]:
        net.add_node(n, seeds=[names[1]], profile=HostProfile(nat=True, relays=(names[1], names[2])))
    assert net.run_for(15, until=net.converged) is not None
    net.kill(names[1])
    assert net.run_for(30, until=lambda: net.all_see(names[1], (PeerState.DEAD,))) is not None
    assert not [e for e in net.events_of(PeerDied) if e[2].peer_id != names[1]]
    assert net.relayed[names[2]] > 0


def test_a_loaded_host_reports_its_lag_and_nobody_dies_under_loss() -> None:
    net = SimNetwork(seed=5, loss=0.05)
    names = ids(12)
    net.add_node(names[0])
    for n in names[1:]:
        net.add_node(n, seeds=[names[0]])
    assert net.run_for(20, until=net.converged) is not None
    slow = names[3]
    net.profiles[slow] = HostProfile(slow=0.05, stall_p=0.05, stall_s=0.5)
    net.run_for(30)
    assert net.nodes[slow].health.raised > 0  # its late timer wakes counted against itself
    assert not net.events_of(PeerDied)


def test_passing_message_objects_behaves_exactly_like_wire_dicts() -> None:
    logs = []
    for decode in (True, False):
        net = SimNetwork(seed=6, loss=0.05, decode=decode, measure_bytes=True)
        names = ids(8)
        net.add_node(names[0])
        for n in names[1:]:
            net.run_for(0.05)
            net.add_node(n, seeds=[names[0]])
        net.run_for(10)
        net.kill(names[5])
        net.run_for(10)
        logs.append((net.log, dict(net.bytes_sent)))
    assert logs[0] == logs[1]


def _core(node: str, records: list[PeerRecord]) -> Membership:
    m = Membership(
        Announcement(node_id=node, addresses=(f"{node}.lan:1",)),
        MembershipConfig(sync_bucket_entries=4),
        random.Random(node),
        now=0.0,
    )
    for i in range(0, len(records), 16):
        m.on_message(records[0].node_id, Gossip(tuple(records[i : i + 16])).to_wire(), 0.0)
    return m


def _sends(actions: list) -> list:
    return [a.message for a in actions if isinstance(a, Send)]


def test_dsync_answers_only_differing_buckets_and_both_sides_reconcile() -> None:
    peers = [
        PeerRecord(f"p{i:02d}", 1, PeerState.ALIVE, Announcement(node_id=f"p{i:02d}", incarnation=1)) for i in range(40)
    ]
    a, b = _core("a", peers), _core("b", peers[:-1])  # b lacks p39
    assert bucket_count(42, 4) == 16
    b.on_message("a", Gossip((a.self_record(),)).to_wire(), 0.0)
    a.on_message("b", Gossip((b.self_record(),)).to_wire(), 0.0)
    same = _core("c", peers)
    same.on_message("a", Gossip((a.self_record(), b.self_record())).to_wire(), 0.0)
    hashes = a._digest_sync()
    assert len(hashes.hashes) == hashes.buckets == 16 and not hashes.digest
    reply = _sends(b.on_message("a", hashes.to_wire(), 1.0))
    parts = [m for m in reply if isinstance(m, DigestSync)]
    assert len(parts) == 1 and parts[0].parts and not parts[0].hashes
    assert len(parts[0].digest) < 42  # only some buckets, never the whole digest
    answers = _sends(a.on_message("b", parts[0].to_wire(), 1.1))
    pushed = {r.node_id for m in answers if isinstance(m, Gossip) for r in m.records}
    if "p39" in pushed:  # the bucket holding p39 was among those answered
        for m in answers:
            b.on_message("a", m.to_wire(), 1.2)
        assert b.state_of("p39") is PeerState.ALIVE
    for _ in range(20):  # repeated syncs converge whatever buckets each answer picked
        for m in _sends(b.on_message("a", a._digest_sync().to_wire(), 2.0)):
            for x in _sends(a.on_message("b", m.to_wire(), 2.1)):
                b.on_message("a", x.to_wire(), 2.2)
    assert b.state_of("p39") is PeerState.ALIVE
    assert not _sends(b.on_message("a", a._digest_sync().to_wire(), 3.0))  # views agree: silence
