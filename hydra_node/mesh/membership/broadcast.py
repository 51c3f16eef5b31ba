"""The dissemination queue: which peers' records ride on the next messages.

Keyed by peer id, so it never holds more than one entry per known peer (bounded by
`max_peers` + 1). Each entry is sent at most `limit` times (SWIM's lambda * log n), least-sent
and then newest first; re-queueing a peer after a change resets its count.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TypeVar

__all__ = ["BroadcastQueue"]

T = TypeVar("T")


class BroadcastQueue:
    def __init__(self) -> None:
        self._sends: dict[str, int] = {}  # peer id -> transmissions so far
        self._order: dict[str, int] = {}  # peer id -> when queued (newer wins ties)
        self._counter = 0
        self.fresh = False  # something was queued that has not been sent yet

    def __len__(self) -> int:
        return len(self._sends)

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._sends

    def push(self, peer_id: str) -> None:
        self._counter += 1
        self._sends[peer_id] = 0
        self._order[peer_id] = self._counter
        self.fresh = True

    def discard(self, peer_id: str) -> None:
        self._sends.pop(peer_id, None)
        self._order.pop(peer_id, None)

    def take(self, count: int, limit: int, lookup: Callable[[str], T | None]) -> list[T]:
        """Up to `count` current values (via `lookup`), counting one transmission for each."""
        if not self._sends or count <= 0:
            return []
        chosen = heapq.nsmallest(count, self._sends, key=lambda i: (self._sends[i], -self._order[i]))
        out: list[T] = []
        for peer_id in chosen:
            value = lookup(peer_id)
            sends = self._sends[peer_id] + 1
            if value is None or sends >= limit:
                self.discard(peer_id)
            else:
                self._sends[peer_id] = sends
            if value is not None:
                out.append(value)
        return out
