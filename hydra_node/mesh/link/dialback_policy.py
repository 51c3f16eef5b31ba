"""Whom a dial-back may dial, and how often (sans-IO, time injected). AutoNAT v2's rule.

A ``reach_dialback`` request names addresses, but a member must not be able to aim us at other
hosts (``ws://127.0.0.1:P/admin/delete?user=alice``, ``169.254.169.254:80``, a victim 1,000 times
a second). So the checker dials only:

* **host** = the requester's IP address as the link the request came on sees it (its *observed*
  address), never a host the requester names: a requested address whose host is anything else is
  answered ``false`` without a dial. A relayed link has no observed address: the request is refused;
* **port** = a port of an address in the requester's own signed announcement (a port it does not
  announce: ``false``, no dial);
* **path** = the fixed dial-back path, no query: the URL is built here, never taken from the request.

Every requested address must be a strict ``host:port`` (or ``ws://host:port``): no user info, path,
query or fragment, a decimal port 1..65535 (:func:`parse_host_port`; otherwise ``false``).
:class:`DialbackLimiter` caps the dials one peer can cause: a token bucket per peer
(``burst`` dials, refilled at ``rate_per_s``); a request that would overdraw it is refused
(``rate_limited``), logged and counted by the caller.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Mapping

__all__ = [
    "DIALBACK_BURST",
    "DIALBACK_RATE_PER_S",
    "DialbackAddressError",
    "DialbackLimiter",
    "DialbackTarget",
    "dialback_targets",
    "parse_host_port",
]

DIALBACK_BURST = 8.0
"""Dials one peer may cause at once (a full request: 8 addresses)."""
DIALBACK_RATE_PER_S = 0.5
"""Dials one peer's bucket regains per second (a node asks each checker at most every 2 s, and
with the host pinned to its observed address a request costs about one dial)."""
MAX_TRACKED_PEERS = 4096
_MAX_ADDR_CHARS = 256


class DialbackAddressError(ValueError):
    """A dial-back address that is not a plain ``host:port`` (the message names it and why)."""


@dataclass(frozen=True)
class DialbackTarget:
    """What we dial: an IP address and a port. The URL path is always the dial-back path."""

    host: str
    port: int

    @property
    def url(self) -> str:
        """``ws://host:port`` (brackets around IPv6): no user info, path or query, ever."""
        host = f"[{self.host}]" if ipaddress.ip_address(self.host).version == 6 else self.host
        return f"ws://{host}:{self.port}"


def parse_host_port(text: object) -> tuple[str, int]:
    """``host:port`` (or ``ws://host:port``, ``[v6]:port``) as ``(host, port)``, hosts lower-cased
    and IPs in canonical form; DialbackAddressError for anything else (user info, a path, a query,
    a fragment, a port that is not 1..65535 in decimal)."""
    if not isinstance(text, str) or not 0 < len(text) <= _MAX_ADDR_CHARS:
        raise DialbackAddressError(f"a dial-back address is a text of 1..{_MAX_ADDR_CHARS} characters")
    rest = text[len("ws://") :] if text.startswith("ws://") else text
    bad = next((c for c in "/?#@\\ %" if c in rest), None)
    if bad is not None or not rest.isprintable():
        raise DialbackAddressError(f"dial-back address {text!r}: host:port only (found {bad or 'a control'!r})")
    host, sep, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            if ipaddress.ip_address(host).version != 6:
                raise ValueError
        except ValueError:
            raise DialbackAddressError(f"dial-back address {text!r}: brackets go around IPv6 only") from None
    elif ":" in host:
        raise DialbackAddressError(f"dial-back address {text!r}: an IPv6 host goes in brackets")
    if not sep or not host or not port.isascii() or not port.isdigit() or len(port) > 5:
        raise DialbackAddressError(f"dial-back address {text!r}: expected host:port with a decimal port")
    if not 1 <= int(port) <= 65535:
        raise DialbackAddressError(f"dial-back address {text!r}: port {port} is not 1..65535")
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        host = host.lower()
    return host, int(port)


def _announced_ports(announced: Iterable[str]) -> frozenset[int]:
    ports = set()
    for addr in announced:
        try:
            ports.add(parse_host_port(addr)[1])
        except DialbackAddressError:
            continue
    return frozenset(ports)


def dialback_targets(
    requested: Iterable[str], observed: str, announced: Iterable[str]
) -> Mapping[str, DialbackTarget | None]:
    """Each requested address → what to dial for it, or None (answered ``false`` undialled): its
    host is not ``observed`` (the requester's address on the link), its port is not among the
    ``announced`` addresses' ports, or it is not a strict ``host:port``."""
    observed_ip = _plain_ip(observed)
    ports = _announced_ports(announced)
    out: dict[str, DialbackTarget | None] = {}
    for addr in dict.fromkeys(requested):
        try:
            host, port = parse_host_port(addr)
        except DialbackAddressError:
            out[addr] = None
            continue
        match = observed_ip is not None and _plain_ip(host) == observed_ip and port in ports
        out[addr] = DialbackTarget(observed_ip, port) if match and observed_ip is not None else None
    return out


def _plain_ip(host: str) -> str | None:
    """``host`` as a canonical IP text (an IPv4-mapped IPv6 address as IPv4), None if not an IP."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


@dataclass
class DialbackLimiter:
    """Per-peer token buckets of dial-back dials (the oldest of ``max_tracked`` peers forgotten first)."""

    burst: float = DIALBACK_BURST
    rate_per_s: float = DIALBACK_RATE_PER_S
    max_tracked: int = MAX_TRACKED_PEERS
    refused: int = 0
    _buckets: OrderedDict[str, tuple[float, float]] = field(default_factory=OrderedDict)  # peer -> (tokens, at)

    def __post_init__(self) -> None:
        if self.burst < 1 or self.rate_per_s <= 0 or self.max_tracked < 1:
            raise ValueError(
                f"a dial-back limiter needs burst >= 1, rate_per_s > 0, max_tracked >= 1; got "
                f"{self.burst}, {self.rate_per_s}, {self.max_tracked}"
            )

    def allow(self, peer: str, dials: int, now: float) -> bool:
        """True (and the dials charged) if ``peer`` may cause ``dials`` dials now; else counted in
        ``refused`` and nothing charged. Zero dials are always allowed."""
        tokens, at = self._buckets.pop(peer, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate_per_s)
        ok = dials <= tokens
        if ok:
            tokens -= dials
        else:
            self.refused += 1
        self._buckets[peer] = (tokens, now)
        while len(self._buckets) > self.max_tracked:
            self._buckets.popitem(last=False)
        return ok
