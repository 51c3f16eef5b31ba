"""`PingTracker`: a link's round-trip time from its PING/PONG frames (sans-IO; time is passed in).

Each ping carries an 8-byte counter as its opaque payload; a pong answering one still
outstanding sets the RTT. At most `MAX_OUTSTANDING_PINGS` are remembered (the oldest is
forgotten), so a peer that never answers cannot grow the table.
"""

from __future__ import annotations

from hydra_node.mesh.link.settings import MAX_OUTSTANDING_PINGS

__all__ = ["PingTracker"]


class PingTracker:
    """Outstanding pings and the latest measured round-trip time (`rtt_ms`, None until a pong)."""

    def __init__(self, max_outstanding: int = MAX_OUTSTANDING_PINGS) -> None:
        self.max_outstanding = max_outstanding
        self.rtt_ms: float | None = None
        self._sent: dict[bytes, float] = {}  # opaque -> when sent, oldest first
        self._counter = 0

    def ping(self, now: float) -> bytes:
        """The opaque payload of the next ping, remembered as sent at `now`."""
        opaque = self._counter.to_bytes(8, "big")
        self._counter += 1
        self._sent[opaque] = now
        while len(self._sent) > self.max_outstanding:
            self._sent.pop(next(iter(self._sent)))
        return opaque

    def pong(self, opaque: bytes, now: float) -> None:
        """A pong arrived at `now`: if it answers an outstanding ping, update `rtt_ms`."""
        sent = self._sent.pop(opaque, None)
        if sent is not None:
            self.rtt_ms = (now - sent) * 1000.0
