"""Announcements are signed by their node: a relayed forgery is rejected and counted."""

from __future__ import annotations

import dataclasses

import nacl.signing

from hydra_node.mesh.membership.signing import sign_announcement, verify_announcement
from hydra_node.mesh.wire.ids import node_id_from_public_key
from hydra_node.mesh.membership import Announcement, Gossip, Membership, ModelEntry, PeerRecord, PeerState


def _node():
    key = nacl.signing.SigningKey.generate()
    return key, node_id_from_public_key(bytes(key.verify_key))


def test_sign_verify_and_tamper():
    key, nid = _node()
    ann = sign_announcement(key, Announcement(node_id=nid, incarnation=5, models=(ModelEntry("m", "ready"),)))
    assert verify_announcement(ann)
    assert verify_announcement(Announcement.from_wire(ann.to_wire()))  # survives the wire
    forged = dataclasses.replace(ann, models=(ModelEntry("evil", "ready"),))
    assert not verify_announcement(forged)
    other_key, _ = _node()
    assert not verify_announcement(sign_announcement(other_key, dataclasses.replace(ann, extra={})))
    assert not verify_announcement(dataclasses.replace(ann, extra={}))


def test_membership_rejects_a_relayed_forgery_and_accepts_the_real_one():
    me_key, me = _node()
    relay_key, relay = _node()
    victim_key, victim = _node()
    core = Membership(Announcement(node_id=me), verify=verify_announcement, sign=lambda a: sign_announcement(me_key, a))
    assert verify_announcement(core.announcement)
    real = sign_announcement(victim_key, Announcement(node_id=victim, incarnation=3))
    forged = dataclasses.replace(real, incarnation=4, models=(ModelEntry("x", "ready"),))
    core.on_message(relay, Gossip((PeerRecord(victim, 4, PeerState.ALIVE, forged),)), now=1.0)
    assert victim not in core.members()
    assert core.statistics(1.0).rejected.get("bad_announcement_signature") == 1
    core.on_message(relay, Gossip((PeerRecord(victim, 3, PeerState.ALIVE, real),)), now=2.0)
    assert victim in core.members()


def test_core_resigns_after_restamping():
    key, nid = _node()
    core = Membership(Announcement(node_id=nid), sign=lambda a: sign_announcement(key, a))
    core.local_update(Announcement(node_id=nid, models=(ModelEntry("m", "loading"),)))
    assert core.announcement.seq >= 1 and verify_announcement(core.announcement)
