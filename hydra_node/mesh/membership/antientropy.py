"""Bounded anti-entropy: bucket hashes of the digest instead of the whole digest.

The periodic push-pull used to send every digest entry (~85 bytes each with a 64-hex node id),
so its cost grew with n. Now (`dsync`, a mixin of `core.Membership`):

1. Every `sync_interval` a node sends one random member its digest split into B buckets,
   B = the smallest power of two with at most `sync_bucket_entries` entries per bucket on
   average, as one 32-bit hash per bucket: ``DigestSync(B, hashes)``. Cost: ~5 bytes per
   bucket, about n / 6 bytes, nothing else when the views agree.
2. The recipient hashes its own digest into the same B buckets and, for buckets that differ,
   answers with its complete digest of some of them, at most `sync_bucket_entries` entries
   unless one bucket holds more: ``DigestSync(B, parts, digest)``.
3. A node that receives parts pushes the records it holds newer (or that the other lacks) in
   those buckets and pulls the ones the other holds newer, exactly as for the full `Sync`.

A node's bucket is the first 4 bytes (big-endian) of SHA-256 of its UTF-8 id, modulo B; an
entry's hash is the first 4 bytes of SHA-256 of the canonical CBOR of its wire form
``[id, incarnation, state, seq]``; a bucket's hash is the sum of its entries' hashes mod 2^32.
The full-digest `Sync` remains for joining (the joiner's digest is tiny) and is still answered.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING

from hydra_node.codec.cbor import encode
from hydra_node.mesh.membership.changes import PeerEntry
from hydra_node.mesh.membership.config import MembershipConfig
from hydra_node.mesh.membership.messages import MAX_WIRE_BUCKETS, DigestEntry, DigestSync, Message, PeerRecord, Sync

__all__ = ["AntiEntropy", "bucket_count", "entry_hash", "id_hash"]

MASK32 = 2**32 - 1
#: A new link gets our whole digest while it holds at most this many buckets' worth of entries
#: (4 x 32 = 128 entries, ~11 KB once per link); beyond that, bucket hashes.
LINK_SYNC_FULL_BUCKETS = 4


def id_hash(node_id: str) -> int:
    """32-bit placement hash of a node id: its bucket is this modulo the bucket count."""
    return int.from_bytes(hashlib.sha256(node_id.encode()).digest()[:4], "big")


def entry_hash(rec: PeerRecord) -> int:
    """32-bit hash of a record's digest entry (its version, not its announcement)."""
    return int.from_bytes(hashlib.sha256(encode(rec.digest().to_wire())).digest()[:4], "big")


def bucket_count(entries: int, per_bucket: int) -> int:
    """Smallest power of two B with entries / B <= per_bucket (at most MAX_WIRE_BUCKETS)."""
    b = 1
    while b * per_bucket < entries and b < MAX_WIRE_BUCKETS:
        b *= 2
    return b


class AntiEntropy:
    """The `dsync` exchange; the state it uses is set up by `Membership.__init__`."""

    config: MembershipConfig
    node_id: str
    _rng: random.Random
    _peers: dict[str, PeerEntry]
    _hash_cache: dict[str, tuple[tuple[int, str, int], int, int]]  # id -> (version, entry hash, id hash)

    if TYPE_CHECKING:  # provided by `Membership` and the sibling mixins

        def self_record(self) -> PeerRecord: ...
        def _all_records(self) -> list[PeerRecord]: ...
        def _sync_message(self) -> Sync: ...
        def _send(self, to: str, msg: Message, *, piggyback: bool = True) -> None: ...
        def _push_pull(self, sender: str, mine: Iterable[PeerRecord], theirs: dict[str, DigestEntry]) -> None: ...

    def _hashed(self, rec: PeerRecord) -> tuple[int, int]:
        """(entry hash, id hash) of a record, cached per id until its version changes."""
        version = (rec.incarnation, rec.state.value, -1 if rec.seq is None else rec.seq)
        hit = self._hash_cache.get(rec.node_id)
        if hit is not None and hit[0] == version:
            return hit[1], hit[2]
        eh = entry_hash(rec)
        ih = hit[2] if hit is not None else id_hash(rec.node_id)
        self._hash_cache[rec.node_id] = (version, eh, ih)
        return eh, ih

    def _digest_sync(self) -> DigestSync:
        records = self._all_records()
        buckets = bucket_count(len(records), self.config.sync_bucket_entries)
        sums = [0] * buckets
        mask = buckets - 1
        for rec in records:
            eh, ih = self._hashed(rec)
            sums[ih & mask] += eh
        return DigestSync(buckets, tuple(s & MASK32 for s in sums), records=(self.self_record(),))

    def _link_sync(self) -> Sync | DigestSync:
        """For a new link: the whole digest while it is small (one round trip, and older nodes
        read it), else the bucket hashes."""
        if len(self._peers) + 1 <= LINK_SYNC_FULL_BUCKETS * self.config.sync_bucket_entries:
            return self._sync_message()
        return self._digest_sync()

    def _in_parts(self, records: Iterable[PeerRecord], parts: set[int], buckets: int) -> list[PeerRecord]:
        mask = buckets - 1
        return [r for r in records if self._hashed(r)[1] & mask in parts]

    def _on_dsync(self, sender: str, msg: DigestSync, now: float) -> None:
        if msg.parts:
            self._reconcile(sender, msg)
        if not msg.hashes:
            return
        mask = msg.buckets - 1
        mine = [0] * msg.buckets
        by_bucket: dict[int, list[PeerRecord]] = {}
        for rec in self._all_records():
            eh, ih = self._hashed(rec)
            mine[ih & mask] += eh
            by_bucket.setdefault(ih & mask, []).append(rec)
        differ = [i for i in range(msg.buckets) if mine[i] & MASK32 != msg.hashes[i]]
        if not differ:
            return
        self._rng.shuffle(differ)
        parts: list[int] = []
        entries: list[DigestEntry] = []
        for i in differ:
            chunk = by_bucket.get(i, [])
            if parts and len(entries) + len(chunk) > self.config.sync_bucket_entries:
                break
            parts.append(i)
            entries.extend(r.digest() for r in chunk)
        self._send(sender, DigestSync(msg.buckets, parts=tuple(sorted(parts)), digest=tuple(entries)))

    def _reconcile(self, sender: str, msg: DigestSync) -> None:
        """Push what we hold newer in the covered buckets, pull what the sender holds newer."""
        parts = set(msg.parts)
        mask = msg.buckets - 1
        theirs = {d.node_id: d for d in msg.digest if id_hash(d.node_id) & mask in parts}
        self._push_pull(sender, self._in_parts(self._all_records(), parts, msg.buckets), theirs)  # handlers.py
