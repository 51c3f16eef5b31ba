"""Membership events as the node's live events (``GET /api/events``, hydra_node/eventlog.py).

:class:`MembershipFeed` is pure: it turns each membership event of the gossip core into the
console's event types, and remembers which models each member announces so a newer
announcement becomes ``model.announced`` / ``model.withdrawn`` for what changed:

* ``PeerJoined`` → ``peer.joined`` (+ ``model.announced`` per model); ``PeerRecovered`` →
  ``peer.alive``; ``PeerSuspected`` → ``peer.suspect``;
* ``PeerDied`` / ``PeerLeft`` → ``peer.dead`` / ``peer.left`` (+ ``model.withdrawn`` per model:
  what a dead peer announced is no longer served);
* ``PeerUpdated`` → the models added and removed since the member's previous announcement.

Peer fields: ``node_id``, ``name`` (when announced), ``addrs``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from hydra_node.mesh.membership import (
    Announcement,
    MembershipEvent,
    PeerDied,
    PeerJoined,
    PeerLeft,
    PeerRecovered,
    PeerSuspected,
)

__all__ = ["MAX_TRACKED_PEERS", "MembershipFeed"]

log = logging.getLogger("hydra.mesh")

#: Members whose announced models are remembered (a mesh this big is past what one node follows).
MAX_TRACKED_PEERS = 4096

_PEER_TYPES = {
    PeerJoined: "peer.joined",
    PeerRecovered: "peer.alive",
    PeerSuspected: "peer.suspect",
    PeerDied: "peer.dead",
    PeerLeft: "peer.left",
}


class MembershipFeed:
    """Membership event → ``[(type, fields), ...]``."""

    def __init__(self) -> None:
        self._models: dict[str, frozenset[str]] = {}  # member → model ids of its last announcement
        self._names: dict[str, dict[str, Any]] = {}  # member → its peer fields (name, addrs)

    def translate(self, ev: MembershipEvent) -> list[tuple[str, dict[str, Any]]]:
        """Never raises: reporting must not stop the membership consumer (a failure is logged)."""
        try:
            return self._translate(ev)
        except Exception as exc:  # noqa: BLE001 -- reporting must never stop the consumer
            log.warning("event=membership_event_feed_failed kind=%s error=%r", type(ev).__name__, exc)
            return []

    def _translate(self, ev: MembershipEvent) -> list[tuple[str, dict[str, Any]]]:
        peer = ev.peer_id
        ann: Announcement | None = getattr(ev, "announcement", None)
        if ann is not None and (peer in self._names or len(self._names) < MAX_TRACKED_PEERS):
            name = ann.extra.get("name") if isinstance(ann.extra, Mapping) else None
            self._names[peer] = {**({"name": name} if isinstance(name, str) else {}), "addrs": list(ann.addresses)}
        out: list[tuple[str, dict[str, Any]]] = []
        kind = _PEER_TYPES.get(type(ev))
        if kind is not None:
            out.append((kind, {"node_id": peer, **self._names.get(peer, {})}))
        if ann is not None:
            now = frozenset(m.id for m in ann.models)
            before = self._models.get(peer, frozenset())
            if peer in self._models or len(self._models) < MAX_TRACKED_PEERS:
                self._models[peer] = now
            out += [("model.announced", {"model": m, "node_id": peer}) for m in sorted(now - before)]
            out += [("model.withdrawn", {"model": m, "node_id": peer}) for m in sorted(before - now)]
        elif isinstance(ev, (PeerDied, PeerLeft)):
            out += [("model.withdrawn", {"model": m, "node_id": peer}) for m in sorted(self._models.pop(peer, ()))]
            self._names.pop(peer, None)
        return out
