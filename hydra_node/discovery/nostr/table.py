"""Sans-IO table of Nostr listings: newest per (pubkey, d), deletions remembered, bounded.

Relays may replay old events, deliver a deletion before the listing it deletes, or
send the same event from several relays; this table makes the outcome independent
of arrival order.  Rejections are counted per :class:`RejectReason`.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

from hydra_node.discovery.nostr.events import (
    Deletion,
    Listing,
    ListingRejected,
    RejectReason,
    parse_event,
)

MAX_LISTINGS = 512  # (pubkey, d) pairs kept; when full the entry expiring first is evicted
MAX_TOMBSTONES = 1024  # deletions remembered so a late copy of a deleted listing stays deleted


@dataclass(frozen=True)
class TableStatistics:
    listings: int
    accepted: int
    deleted: int
    evicted: int
    rejected: Mapping[str, int]


class ListingTable:
    def __init__(self, max_listings: int = MAX_LISTINGS, max_tombstones: int = MAX_TOMBSTONES) -> None:
        self._max = max_listings
        self._max_tomb = max_tombstones
        self._listings: dict[tuple[str, str], Listing] = {}
        self._tombstones: OrderedDict[tuple[str, str], int] = OrderedDict()  # key -> deletion created_at
        self._deleted_ids: OrderedDict[str, None] = OrderedDict()
        self.rejected: Counter[RejectReason] = Counter()
        self.accepted = 0
        self.deleted = 0
        self.evicted = 0
        self.generation = 0

    def offer_raw(self, raw: Any, *, now: int) -> bool:
        """Parse, verify and fold in one event from a relay; True when the visible set changed."""
        try:
            item = parse_event(raw, now=now)
        except ListingRejected as exc:
            self.rejected[exc.reason] += 1
            return False
        if isinstance(item, Deletion):
            return self.apply_deletion(item)
        return self.offer(item, now=now)

    def offer(self, listing: Listing, *, now: int) -> bool:
        if listing.expires_at <= now:
            return self._reject(RejectReason.EXPIRED)
        if listing.event_id in self._deleted_ids or self._tombstones.get(listing.key, -1) >= listing.created_at:
            return self._reject(RejectReason.DELETED)
        old = self._listings.get(listing.key)
        if old is not None:
            if old.event_id == listing.event_id:
                return False  # the same event from another relay
            # NIP-01: newest created_at wins; on a tie the lowest id wins.
            if (listing.created_at, _neg(listing.event_id)) <= (old.created_at, _neg(old.event_id)):
                return self._reject(RejectReason.STALE)
        elif len(self._listings) >= self._max:
            self.expire(now)
            if len(self._listings) >= self._max:
                victim = min(self._listings.values(), key=lambda x: x.expires_at)
                if victim.expires_at >= listing.expires_at:
                    self.evicted += 1
                    return False
                del self._listings[victim.key]
                self.evicted += 1
        self._listings[listing.key] = listing
        self.accepted += 1
        self.generation += 1
        return True

    def apply_deletion(self, deletion: Deletion) -> bool:
        changed = False
        for d in deletion.coordinates:
            key = (deletion.pubkey, d)
            self._remember(self._tombstones, key, max(deletion.created_at, self._tombstones.get(key, 0)))
            old = self._listings.get(key)
            if old is not None and old.created_at <= deletion.created_at:
                del self._listings[key]
                changed = True
        for event_id in deletion.event_ids:
            self._remember(self._deleted_ids, event_id, None)
            for key, old in list(self._listings.items()):
                if old.event_id == event_id and old.pubkey == deletion.pubkey:
                    del self._listings[key]
                    changed = True
        if changed:
            self.deleted += 1
            self.generation += 1
        return changed

    def expire(self, now: int) -> bool:
        gone = [k for k, v in self._listings.items() if v.expires_at <= now]
        for k in gone:
            del self._listings[k]
        if gone:
            self.generation += 1
        return bool(gone)

    def listings(self, now: int) -> tuple[Listing, ...]:
        """Unexpired listings, newest first."""
        live = (v for v in self._listings.values() if v.expires_at > now)
        return tuple(sorted(live, key=lambda x: (-x.created_at, x.key)))

    def statistics(self) -> TableStatistics:
        return TableStatistics(
            listings=len(self._listings),
            accepted=self.accepted,
            deleted=self.deleted,
            evicted=self.evicted,
            rejected={r.value: n for r, n in sorted(self.rejected.items(), key=lambda x: x[0].value)},
        )

    def _reject(self, reason: RejectReason) -> bool:
        self.rejected[reason] += 1
        return False

    def _remember(self, od: OrderedDict, key: Any, value: Any) -> None:
        od[key] = value
        od.move_to_end(key)
        while len(od) > self._max_tomb:
            od.popitem(last=False)


def _neg(event_id: str) -> tuple[int, ...]:
    """Order ids so that the lowest id compares greatest (NIP-01 tie-break)."""
    return tuple(-ord(c) for c in event_id)
