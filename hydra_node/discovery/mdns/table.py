"""Sans-IO table of adverts seen on the LAN, with TTL expiry (time is passed in)."""

from __future__ import annotations

from dataclasses import dataclass

from hydra_node.discovery.mdns.wire import MdnsAdvert, MdnsResponse

MAX_ADVERTS = 256  # distinct instances remembered; a LAN with more hydra nodes than this is not our case


@dataclass(frozen=True)
class SeenAdvert:
    advert: MdnsAdvert
    first_seen: float
    last_seen: float
    expires_at: float


class AdvertTable:
    """Instance label -> newest advert; entries expire ``ttl`` seconds after they were last heard."""

    def __init__(self, own_origin: str, max_adverts: int = MAX_ADVERTS) -> None:
        self._own = own_origin
        self._max = max_adverts
        self._entries: dict[str, SeenAdvert] = {}
        self.generation = 0  # bumped on every visible change
        self.dropped_own = 0
        self.dropped_full = 0

    def apply(self, response: MdnsResponse, now: float) -> bool:
        """Fold a response in; returns True when the visible set changed."""
        changed = self.expire(now)
        for label in response.goodbyes:
            if label in self._entries:
                del self._entries[label]
                changed = True
        for advert, ttl in response.adverts:
            if advert.origin == self._own:
                self.dropped_own += 1
                continue
            old = self._entries.get(advert.instance)
            if old is None and len(self._entries) >= self._max:
                self.dropped_full += 1
                continue
            first = old.first_seen if old is not None else now
            # a short-lived unicast answer (10 s) never cuts a longer multicast TTL short
            expires = max(now + ttl, old.expires_at if old is not None else now)
            self._entries[advert.instance] = SeenAdvert(advert, first, now, expires)
            if old is None or old.advert != advert:
                changed = True
        if changed:
            self.generation += 1
        return changed

    def expire(self, now: float) -> bool:
        gone = [k for k, e in self._entries.items() if e.expires_at <= now]
        for k in gone:
            del self._entries[k]
        if gone:
            self.generation += 1
        return bool(gone)

    def next_deadline(self) -> float | None:
        return min((e.expires_at for e in self._entries.values()), default=None)

    def snapshot(self, now: float) -> tuple[SeenAdvert, ...]:
        return tuple(sorted((e for e in self._entries.values() if e.expires_at > now), key=lambda e: e.advert.instance))

    def __len__(self) -> int:
        return len(self._entries)
