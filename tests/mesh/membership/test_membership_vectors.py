"""protocol/vectors/membership.json: the nack, suspect and dsync messages and the dsync hashing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hydra_node.codec import cbor
from hydra_node.mesh.membership import InvalidMessage, PeerRecord, decode_message
from hydra_node.mesh.membership.antientropy import bucket_count, entry_hash, id_hash
from hydra_node.mesh.membership.messages import DigestEntry

DOC = json.loads((Path(__file__).resolve().parents[3] / "protocol" / "vectors" / "membership.json").read_text())


@pytest.mark.parametrize("vector", DOC["messages"], ids=lambda v: v["name"])
def test_messages_decode_and_re_encode_to_the_same_bytes(vector: dict) -> None:
    body = cbor.decode(bytes.fromhex(vector["hex"]))
    assert body == {"t": "gossip", "m": vector["decoded"]}
    msg = decode_message(body["m"])
    assert cbor.encode({"t": "gossip", "m": msg.to_wire()}).hex() == vector["hex"]


@pytest.mark.parametrize("vector", DOC["invalid"], ids=lambda v: v["name"])
def test_invalid_messages_are_rejected(vector: dict) -> None:
    with pytest.raises(InvalidMessage):
        decode_message(vector["decoded"])


def test_bucket_hashing_matches_the_vectors() -> None:
    h = DOC["bucket_hashes"]
    records = [DigestEntry.from_wire(w) for w in h["records"]]
    tomb = [PeerRecord(d.node_id, d.incarnation, d.state) for d in records]
    assert [id_hash(r.node_id) for r in tomb] == h["id_hashes"]
    assert [entry_hash(r) for r in tomb] == h["entry_hashes"]
    sums = [0] * h["buckets"]
    for r in tomb:
        sums[id_hash(r.node_id) % h["buckets"]] += entry_hash(r)
    assert [s % 2**32 for s in sums] == h["hashes"]
    assert all(bucket_count(n, per) == b for n, per, b in h["bucket_count_examples"])
