"""Remembered peers (HOME/mesh/peers.json): what is written, when, and what a restart dials."""

from __future__ import annotations

import json

from hydra_node.mesh.membership import Announcement
from hydra_node.mesh.peerstore import (
    MAX_ADDRESSES_PER_PEER,
    MAX_REMEMBERED_PEERS,
    PeerStore,
    remembered_candidates,
    remembered_document,
)

MESH = "0123456789abcdef0123456789abcdef"


def ann(node_id: str, *addrs: str) -> Announcement:
    return Announcement(node_id=node_id, addresses=addrs)


def node(i: int) -> str:
    return f"{i:064x}"


def test_document_keeps_members_with_addresses_sorted_and_bounded():
    members = {node(i): ann(node(i), f"10.0.0.{i % 250}:9338") for i in range(MAX_REMEMBERED_PEERS + 5)}
    members[node(999)] = None  # no announcement yet
    members[node(998)] = ann(node(998))  # nothing to dial
    doc = remembered_document(MESH, members)
    assert doc["mesh_id"] == MESH and len(doc["peers"]) == MAX_REMEMBERED_PEERS
    assert list(doc["peers"]) == sorted(doc["peers"]) and node(999) not in doc["peers"]
    assert remembered_document(MESH, {node(1): None}) is None


def test_candidates_only_for_our_mesh_and_skip_malformed_entries():
    data = {
        "mesh_id": MESH,
        "peers": {
            node(1): ["10.0.0.1:9338", "ws://h:1"],
            node(2): "not a list",
            node(3): [],
            node(4): [f"10.0.0.{i}:1" for i in range(20)],
        },
    }
    cands = remembered_candidates(data, MESH)
    assert [c.peer_id for c in cands] == [node(1), node(4)]
    assert cands[0].urls == ("ws://10.0.0.1:9338", "ws://h:1")
    assert len(cands[1].urls) == MAX_ADDRESSES_PER_PEER
    assert remembered_candidates(data, "f" * 32) == []
    for junk in (None, [], {"mesh_id": MESH}, {"mesh_id": MESH, "peers": []}, "x"):
        assert remembered_candidates(junk, MESH) == []


def test_store_writes_only_when_addresses_change_and_reads_back(tmp_path):
    store = PeerStore(tmp_path / "mesh" / "peers.json")
    assert store.candidates(MESH) == []  # no file yet
    members = {node(1): ann(node(1), "10.0.0.1:9338")}
    assert store.remember(MESH, members)
    assert not store.remember(
        MESH, {node(1): Announcement(node_id=node(1), addresses=("10.0.0.1:9338",), queue_depth=3)}
    )  # same addresses: no write
    assert json.loads(store.path.read_text())["peers"] == {node(1): ["10.0.0.1:9338"]}
    assert store.remember(MESH, {**members, node(2): ann(node(2), "10.0.0.2:9338")})
    assert [c.peer_id for c in PeerStore(store.path).candidates(MESH)] == [node(1), node(2)]


def test_store_ignores_an_unreadable_file(tmp_path):
    path = tmp_path / "peers.json"
    path.write_text("{not json")
    assert PeerStore(path).candidates(MESH) == []
