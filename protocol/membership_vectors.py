"""Vectors for the Lifeguard and anti-entropy membership messages (protocol/README.md section
11.1: nack, suspect, dsync) and the dsync bucket hashes: imported by generate_vectors.py."""

from __future__ import annotations

from typing import Any

from hydra_node.codec import cbor
from hydra_node.mesh.membership.antientropy import bucket_count, entry_hash, id_hash
from hydra_node.mesh.membership.messages import DigestEntry, DigestSync, Nack, PeerRecord, Suspect
from hydra_node.mesh.membership.state import PeerState

NODE_A = "8f" * 32
NODE_B = "3c" * 32


def membership_vectors(to_json: Any) -> dict[str, Any]:
    entries = [
        DigestEntry(NODE_A, 1795940000, PeerState.ALIVE, 3),
        DigestEntry(NODE_B, 1795940007, PeerState.SUSPECT, None),
    ]
    tomb = [PeerRecord(NODE_A, 1795940000, PeerState.DEAD), PeerRecord(NODE_B, 1795940007, PeerState.LEFT)]
    buckets = 2
    sums = [0] * buckets
    for r in tomb:
        sums[id_hash(r.node_id) % buckets] += entry_hash(r)
    messages = [
        ("nack", Nack(41)),
        ("suspect", Suspect(NODE_B, 1795940007)),
        ("dsync_hashes", DigestSync(buckets, tuple(s % 2**32 for s in sums))),
        ("dsync_parts", DigestSync(4, parts=(1, 3), digest=tuple(entries))),
    ]
    invalid = [
        (
            "buckets not a power of two",
            {"type": "dsync", "buckets": 3, "hashes": [], "parts": [], "digest": [], "records": []},
        ),
        (
            "hash count differs from buckets",
            {"type": "dsync", "buckets": 2, "hashes": [1], "parts": [], "digest": [], "records": []},
        ),
        (
            "part outside the buckets",
            {"type": "dsync", "buckets": 2, "hashes": [], "parts": [2], "digest": [], "records": []},
        ),
        (
            "digest without parts",
            {"type": "dsync", "buckets": 1, "hashes": [], "parts": [], "digest": [entries[0].to_wire()], "records": []},
        ),
        (
            "hash above 32 bits",
            {"type": "dsync", "buckets": 1, "hashes": [2**32], "parts": [], "digest": [], "records": []},
        ),
        ("nack with an unknown key", {"type": "nack", "probe": 1, "target": NODE_A}),
        ("suspect without inc", {"type": "suspect", "target": NODE_A}),
    ]
    return {
        "description": "Membership messages added for Lifeguard (nack, suspect) and bounded anti-entropy (dsync); "
        "each 'hex' is the canonical CBOR of the priority-lane body {t: gossip, m: message}. "
        "'bucket_hashes' pins the dsync hashing: id_hash = SHA-256(id)[0:4] big-endian, "
        "entry_hash = SHA-256(cbor([id, inc, state, seq]))[0:4], bucket = id_hash mod B, "
        "a bucket's hash = sum of its entry hashes mod 2^32.",
        "messages": [
            {"name": name, "decoded": to_json(m.to_wire()), "hex": cbor.encode({"t": "gossip", "m": m.to_wire()}).hex()}
            for name, m in messages
        ],
        "invalid": [{"name": name, "decoded": to_json(w), "error": "invalid_message"} for name, w in invalid],
        "bucket_hashes": {
            "records": [to_json(r.digest().to_wire()) for r in tomb],
            "id_hashes": [id_hash(r.node_id) for r in tomb],
            "entry_hashes": [entry_hash(r) for r in tomb],
            "buckets": buckets,
            "hashes": [s % 2**32 for s in sums],
            "bucket_count_examples": [[n, 32, bucket_count(n, 32)] for n in (1, 32, 33, 100, 1000, 5000)],
        },
    }
