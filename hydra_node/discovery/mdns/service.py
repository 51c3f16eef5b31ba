"""trio driver for mDNS discovery of ``_hydra._tcp.local.`` (codec in :mod:`mdns_wire`).

One UDP socket joined to the group.  At start the service announces three times
(0, 1 and 3 s: RFC 6762 §8.3) and queries three times, then re-announces every
``reannounce_s``; it answers PTR queries after a 20-120 ms random delay, never
multicasting its records more often than once a second (§6).  Adverts heard from
others live in a bounded :class:`AdvertTable` until their TTL runs out or a goodbye
arrives.  Queries leave from a second, ephemeral-port socket, so responders answer
them by unicast straight away (§6.7).  On the way out it multicasts a goodbye (TTL 0) in a shielded, bounded
``finally``.  Packets carrying our own ``origin`` (or our query id) are dropped:
on ``lo`` multicast loops back whatever ``IP_MULTICAST_LOOP`` says.
"""

from __future__ import annotations

import logging
import math
import random
import secrets
import socket
import struct
from dataclasses import dataclass
from typing import Callable

import trio

from hydra_node.discovery.mdns.table import MAX_ADVERTS, AdvertTable, SeenAdvert
from hydra_node.discovery.mdns.wire import (
    DEFAULT_TTL,
    MAX_PACKET,
    MdnsAdvert,
    MdnsDecodeError,
    MdnsQuery,
    decode_packet,
    encode_announcement,
    encode_goodbye,
    encode_query,
)

log = logging.getLogger("hydra.discovery.mdns")

MDNS_GROUP = "224.0.0.251"
MDNS_PORT = 5353
GOODBYE_BOUND_S = 1.0  # clean-up budget for goodbyes on shutdown
MIN_MULTICAST_INTERVAL_S = 1.0  # RFC 6762 §6: one multicast of a record per second at most
INITIAL_ANNOUNCE_GAPS_S = (1.0, 2.0)  # announce at 0, 1, 3 s
INITIAL_QUERY_GAPS_S = (1.0, 2.0)
RESPONSE_DELAY_S = (0.02, 0.12)  # RFC 6762 §6: random 20-120 ms before answering a shared record


@dataclass(frozen=True)
class MdnsConfig:
    group: str = MDNS_GROUP
    port: int = MDNS_PORT
    interface: str = "0.0.0.0"  # IPv4 address of the interface to join and send on
    ttl: int = DEFAULT_TTL
    reannounce_s: float = 60.0
    max_adverts: int = MAX_ADVERTS
    announce_gaps_s: tuple[float, ...] = INITIAL_ANNOUNCE_GAPS_S
    query_gaps_s: tuple[float, ...] = INITIAL_QUERY_GAPS_S


@dataclass(frozen=True)
class MdnsStatistics:
    announcements_sent: int
    queries_sent: int
    queries_answered: int
    packets_received: int
    malformed: int
    rejected_adverts: int
    own_dropped: int
    table_full_dropped: int
    adverts: int


class MdnsService:
    """Announce ``advert`` (or only browse when it is None) and track other nodes' adverts."""

    def __init__(
        self,
        config: MdnsConfig,
        advert: MdnsAdvert | None,
        *,
        origin: str | None = None,
        rng: random.Random | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self._advert = advert
        self.origin = advert.origin if advert is not None else (origin or secrets.token_hex(8))
        self._rng = rng or random.Random()
        self._on_change = on_change
        self._table = AdvertTable(self.origin, config.max_adverts)
        self._query_id = self._rng.randrange(1, 0x10000)
        self._changed = trio.Event()
        self._wake = trio.Event()
        self._announce_at = 0.0
        self._announce_count = 0
        self._query_at = 0.0
        self._query_count = 0
        self._last_multicast = -math.inf
        self._announced = False
        self._stats = dict.fromkeys(
            (
                "announcements_sent",
                "queries_sent",
                "queries_answered",
                "packets_received",
                "malformed",
                "rejected_adverts",
                "own_dropped_queries",
            ),
            0,
        )

    # ------------------------------------------------------------ public surface

    @property
    def generation(self) -> int:
        return self._table.generation

    def adverts(self) -> tuple[MdnsAdvert, ...]:
        """Adverts of other nodes currently alive, sorted by instance."""
        return tuple(s.advert for s in self._table.snapshot(trio.current_time()))

    def seen(self) -> tuple[SeenAdvert, ...]:
        return self._table.snapshot(trio.current_time())

    async def wait_changed(self, generation: int) -> int:
        """Wait until the advert set differs from ``generation``; returns the new generation."""
        while self._table.generation == generation:
            await self._changed.wait()
        return self._table.generation

    async def wait_for(self, predicate: Callable[[tuple[MdnsAdvert, ...]], bool]) -> tuple[MdnsAdvert, ...]:
        """Wait until ``predicate(adverts())`` holds (bound it with a cancel scope)."""
        while True:
            gen = self.generation
            current = self.adverts()
            if predicate(current):
                return current
            await self.wait_changed(gen)

    def browse(self) -> None:
        """Ask the LAN again (a query goes out within a second)."""
        self._query_at = trio.current_time()
        self._query_count = len(self.config.query_gaps_s)
        self._wake.set()

    def update_advert(self, advert: MdnsAdvert) -> None:
        """Replace our TXT data (node count, models, ...) and re-announce soon."""
        if self._advert is None or advert.instance != self._advert.instance or advert.origin != self.origin:
            raise ValueError("update_advert keeps the instance and origin of the running advert")
        self._advert = advert
        self._announce_count = 0
        self._schedule_announce(trio.current_time())

    def statistics(self) -> MdnsStatistics:
        s = self._stats
        return MdnsStatistics(
            announcements_sent=s["announcements_sent"],
            queries_sent=s["queries_sent"],
            queries_answered=s["queries_answered"],
            packets_received=s["packets_received"],
            malformed=s["malformed"],
            rejected_adverts=s["rejected_adverts"],
            own_dropped=self._table.dropped_own + s["own_dropped_queries"],
            table_full_dropped=self._table.dropped_full,
            adverts=len(self._table),
        )

    # ------------------------------------------------------------ driver

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = await self._open_socket()
        with sock:
            try:
                query_sock = await self._open_query_socket()
            except BaseException:
                sock.close()
                raise
            with query_sock:
                await self._serve(sock, query_sock, task_status)

    async def _serve(self, sock, query_sock, task_status) -> None:
        try:
            now = trio.current_time()
            self._announce_at = now if self._advert is not None else math.inf
            self._query_at = now
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receiver, sock)
                nursery.start_soon(self._receiver, query_sock)
                nursery.start_soon(self._sender, sock, query_sock)
                nursery.start_soon(self._expirer)
                log.info(
                    "event=mdns_started group=%s port=%d interface=%s origin=%s",
                    self.config.group,
                    self.config.port,
                    self.config.interface,
                    self.origin,
                )
                task_status.started()
        finally:
            if self._advert is not None and self._announced:
                with trio.CancelScope(shield=True) as cs:
                    cs.deadline = trio.current_time() + GOODBYE_BOUND_S
                    await self._send(sock, encode_goodbye(self._advert))
                    log.info("event=mdns_goodbye instance=%s", self._advert.instance)

    async def _open_socket(self) -> trio.socket.SocketType:
        c = self.config
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            await sock.bind(("", c.port))
            mreq = struct.pack("4s4s", socket.inet_aton(c.group), socket.inet_aton(c.interface))
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
            self._send_multicast_from_interface(sock)
        except BaseException:
            sock.close()
            raise
        return sock

    async def _open_query_socket(self) -> trio.socket.SocketType:
        """Queries leave from an ephemeral port, so answers come back by unicast (RFC 6762 §6.7)
        at once, instead of waiting out a responder's one-multicast-per-second limit."""
        c = self.config
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            await sock.bind((c.interface, 0))
            self._send_multicast_from_interface(sock)
        except BaseException:
            sock.close()
            raise
        return sock

    def _send_multicast_from_interface(self, sock: trio.socket.SocketType) -> None:
        """Multicast out of the configured interface, to the whole site, looped back too
        (on ``lo`` the loop cannot be turned off anyway: we filter our own packets)."""
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(self.config.interface))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)

    async def _send(self, sock: trio.socket.SocketType, data: bytes, to: tuple[str, int] | None = None) -> None:
        try:
            await sock.sendto(data, to or (self.config.group, self.config.port))
        except OSError as exc:  # e.g. network down: log and carry on, the next round retries
            log.warning("event=mdns_send_failed error=%r", exc)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
        if self._on_change is not None:
            self._on_change()

    def _schedule_announce(self, earliest: float) -> None:
        at = max(earliest, self._last_multicast + MIN_MULTICAST_INTERVAL_S)
        if at < self._announce_at:
            self._announce_at = at
            self._wake.set()

    async def _receiver(self, sock: trio.socket.SocketType) -> None:
        while True:
            data, addr = await sock.recvfrom(MAX_PACKET + 1)
            self._stats["packets_received"] += 1
            try:
                event = decode_packet(data)
            except MdnsDecodeError as exc:
                self._stats["malformed"] += 1
                log.debug("event=mdns_malformed from=%s error=%s", addr, exc)
                continue
            now = trio.current_time()
            if isinstance(event, MdnsQuery):
                if event.query_id == self._query_id:
                    self._stats["own_dropped_queries"] += 1
                elif event.asks_for_service and self._advert is not None:
                    if self._advert.instance not in event.known_instances:
                        self._stats["queries_answered"] += 1
                        if addr[1] != self.config.port:  # one-shot querier: unicast answer, now
                            reply = encode_announcement(self._advert, self.config.ttl, legacy_query_id=event.query_id)
                            await self._send(sock, reply, (addr[0], addr[1]))
                        else:
                            self._schedule_announce(now + self._rng.uniform(*RESPONSE_DELAY_S))
                continue
            self._stats["rejected_adverts"] += len(event.rejected)
            if self._table.apply(event, now):
                self._notify()

    async def _sender(self, sock: trio.socket.SocketType, query_sock: trio.socket.SocketType) -> None:
        while True:
            with trio.move_on_at(min(self._announce_at, self._query_at)):
                await self._wake.wait()
            self._wake = trio.Event()
            now = trio.current_time()
            if now >= self._query_at:
                await self._send(query_sock, encode_query(self._query_id))
                self._stats["queries_sent"] += 1
                gaps = self.config.query_gaps_s
                self._query_at = now + gaps[self._query_count] if self._query_count < len(gaps) else math.inf
                self._query_count += 1
            if self._advert is not None and now >= self._announce_at:
                await self._send(sock, encode_announcement(self._advert, self.config.ttl))
                self._announced = True
                self._last_multicast = now
                self._stats["announcements_sent"] += 1
                gaps = self.config.announce_gaps_s
                k = self._announce_count
                self._announce_at = now + (gaps[k] if k < len(gaps) else self.config.reannounce_s)
                self._announce_count += 1

    async def _expirer(self) -> None:
        while True:
            deadline = self._table.next_deadline()
            gen = self._table.generation
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self.wait_changed(gen)
                continue
            if self._table.expire(trio.current_time()):
                self._notify()
