"""Connection-level limits of the HTTP server, as pure policy (no IO, time passed in).

:class:`HttpLimits` names every bound; :class:`ConnectionTable` admits connections per client
address and in total; :class:`RateLimitedLog` decides which refusal lines reach the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["INFERENCE_BODY_BYTES", "TEXT_BODY_BYTES", "ConnectionTable", "HttpLimits", "RateLimitedLog"]

#: Largest body of a request's text (every route; the default ``max_body_bytes``).
TEXT_BODY_BYTES = 8 * 1024 * 1024
#: Largest body the inference port (:9337) reads: a chat's images as base64 (12 MiB of image
#: bytes are about 16.1 MiB) plus TEXT_BODY_BYTES of text; the routes check the two parts
#: (hydra_node/api/images.py ``check_body_size``), and more than this is a 413 before the body is read.
INFERENCE_BODY_BYTES = 24 * 1024 * 1024


@dataclass(frozen=True)
class HttpLimits:
    #: Largest request head (request line + headers) accepted; more gets 431.
    max_header_bytes: int = 64 * 1024
    #: Largest request body accepted; more gets 413.
    max_body_bytes: int = TEXT_BODY_BYTES
    #: How long a keep-alive connection may sit idle between requests.
    keepalive_idle_s: float = 75.0
    #: How long a request head may take: from accept for the first request, from its first byte after.
    head_timeout_s: float = 5.0
    #: How long a client may take to send a request body once the head arrived.
    body_timeout_s: float = 60.0
    #: Connections served at once per listener, and per client address.
    max_connections: int = 512
    max_per_address: int = 128
    #: Connections over those caps that are still read for one request (``/health`` answered,
    #: anything else 429); beyond this they are closed at once.
    max_overflow: int = 64
    max_overflow_per_address: int = 8
    #: How long an over-cap connection may take to send its one request head.
    overflow_head_timeout_s: float = 2.0
    #: Bytes read from a connection but not yet processed (requests pipelined behind the one
    #: being answered), at most; at the bound the connection is not read (TCP pushes back on the
    #: client) until requests are taken from the buffer. Never less than max_header_bytes.
    max_buffered_bytes: int = 64 * 1024
    #: After a refusal, how much of the unread body we read and drop before closing, and how long.
    discard_max_bytes: int = 64 * 1024 * 1024
    discard_timeout_s: float = 10.0


@dataclass
class ConnectionTable:
    """Open connections by client address; :meth:`admit` says whether one more fits."""

    max_total: int
    max_per_address: int
    _by_address: dict[str, int] = field(default_factory=dict)
    total: int = 0

    def admit(self, address: str) -> bool:
        n = self._by_address.get(address, 0)
        if self.total >= self.max_total or n >= self.max_per_address:
            return False
        self._by_address[address] = n + 1
        self.total += 1
        return True

    def release(self, address: str) -> None:
        n = self._by_address.get(address, 0)
        if n <= 1:
            self._by_address.pop(address, None)
        else:
            self._by_address[address] = n - 1
        self.total = max(0, self.total - 1)

    def count(self, address: str) -> int:
        return self._by_address.get(address, 0)


@dataclass
class RateLimitedLog:
    """A token bucket over log lines: :meth:`allow` is True for at most ``burst`` lines at once
    and ``per_minute`` a minute after that; :attr:`suppressed` counts the rest (reported with
    the next line that gets through)."""

    per_minute: float = 10.0
    burst: int = 10
    _tokens: float = -1.0
    _last: float = 0.0
    suppressed: int = 0

    def allow(self, now: float) -> bool:
        if self._tokens < 0:
            self._tokens, self._last = float(self.burst), now
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.per_minute / 60.0)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        n, self.suppressed = self.suppressed, 0
        return n
