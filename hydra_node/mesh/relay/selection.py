"""Relay policy (pure): what we announce, which relays to reserve at, how to dial a peer.

Our announcement's ``extra`` carries three keys (no core change needed):

* ``reach``: our reachability verdict (true, false or "unknown");
* ``relay``: ``{"v": 1, "bytes_per_s": N}`` when we relay for others;
* ``relays``: node ids of the relays we hold a reservation at (when we cannot be dialled).

A peer that announced ``reach: false`` is dialled only through its relays (its own addresses
cannot answer); any other is dialled directly first, then through its relays.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from hydra_node.mesh.wire.ids import is_node_id

__all__ = [
    "MAX_RELAYS",
    "RELAY_URL_PREFIX",
    "announce_extra",
    "choose_relays",
    "dial_urls",
    "offers_relay",
    "parse_relay_url",
    "relay_url",
    "relays_of",
]

RELAY_URL_PREFIX = "relay:"
MAX_RELAYS = 2
"""Relays a node that cannot be dialled reserves at: one to use, one to move to when it fails."""
MAX_ANNOUNCED_RELAYS = 4
"""Relays of a peer we try (an announcement listing more is read up to this many)."""


def relay_url(relay_id: str) -> str:
    return RELAY_URL_PREFIX + relay_id


def parse_relay_url(url: str) -> str | None:
    if not url.startswith(RELAY_URL_PREFIX):
        return None
    relay = url[len(RELAY_URL_PREFIX) :]
    return relay if is_node_id(relay) else None


def announce_extra(*, reach: bool | str, offering: bool, bytes_per_s: int, relays: Iterable[str]) -> dict[str, Any]:
    extra: dict[str, Any] = {"reach": reach}
    if offering:
        extra["relay"] = {"v": 1, "bytes_per_s": int(bytes_per_s)}
    held = sorted(relays)
    if held:
        extra["relays"] = held
    return extra


def offers_relay(extra: Mapping[str, Any]) -> bool:
    offer = extra.get("relay")
    return isinstance(offer, Mapping) and offer.get("v") == 1 and extra.get("reach") is True


def relays_of(extra: Mapping[str, Any]) -> list[str]:
    """The relays a peer announced (untrusted: only node ids, at most MAX_ANNOUNCED_RELAYS)."""
    relays = extra.get("relays")
    if not isinstance(relays, (list, tuple)):
        return []
    return [r for r in relays if is_node_id(r)][:MAX_ANNOUNCED_RELAYS]


def choose_relays(
    offers: Mapping[str, Mapping[str, Any]],
    alive: Callable[[str], bool],
    held: Iterable[str],
    failed: Mapping[str, float],
    now: float,
    *,
    wanted: int = MAX_RELAYS,
    rtt_ms: Callable[[str], float | None] = lambda _: None,
) -> list[str]:
    """New relays to reserve at: alive peers offering relaying, not held, not failed recently (``failed``:
    peer → retry-after time), nearest first (unknown RTT last, then by id for determinism)."""
    held = set(held)
    need = wanted - len(held)
    if need <= 0:
        return []
    pool = [
        p
        for p, extra in offers.items()
        if p not in held and offers_relay(extra) and alive(p) and failed.get(p, 0.0) <= now
    ]
    pool.sort(key=lambda p: (rtt_ms(p) is None, rtt_ms(p) or 0.0, p))
    return pool[:need]


def dial_urls(extra: Mapping[str, Any], direct: list[str], linked: Callable[[str], bool], *, me: str) -> list[str]:
    """Where to dial a peer: its direct URLs (unless it announced it cannot be dialled), then its
    relays — those we already have a link to first — never ourselves."""
    relays = [r for r in relays_of(extra) if r != me]
    relays.sort(key=lambda r: not linked(r))
    urls = [] if extra.get("reach") is False and relays else list(direct)
    return urls + [relay_url(r) for r in relays]
