"""`RelayServer`: this node relaying for others (trio side of ``limits.RelayBook``).

A reservation is a ``relay_reserve`` stream held open by the reserving node; while it lasts (at most
the TTL) others may ``relay_connect`` to that node: the relay opens ``relay_incoming`` on the
reserving node's link and splices the two streams' bytes, paced by one token bucket for the whole
relay. It never sees plaintext: what it splices is the end-to-end link's handshake and ciphertext.
A circuit ends when either side's stream or link ends (then the other side is reset), or when no
byte has passed either way for ``circuit_idle_s`` (both sides reset; counted). Reservations and
circuits are also capped per member (``limits.RelayBook``): by node id and by the IP address its
link comes from, so one member cannot hold the whole relay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import trio

from hydra_node.mesh.link.stream import LinkStream
from hydra_node.mesh.relay.limits import Circuit, RelayBook, RelayLimits, RelayRefused, TokenBucket
from hydra_node.mesh.relay.messages import (
    INCOMING_KIND,
    RELAY_VERSION,
    RelayProtocolError,
    ReplyDecoder,
    encode_reply,
    observed_fields,
    parse_connect,
)
from hydra_node.mesh.wire.errors import LinkClosed, StreamReset

__all__ = ["RELAY_REPLY_TIMEOUT_S", "RelayServer", "RelayServerStatistics"]

log = logging.getLogger("hydra.mesh.relay")

RELAY_REPLY_TIMEOUT_S = 5.0
"""Bound on the target's answer to ``relay_incoming`` before the dialler is refused."""
MAX_REPLY_READ_BYTES = 64 * 1024
"""Bytes read while waiting for a reply before the stream is given up as broken."""


@dataclass(frozen=True)
class RelayServerStatistics:
    reservations: int
    circuits: int
    circuits_opened: int
    circuits_idle_closed: int
    bytes_relayed: int
    refused: Mapping[str, int]
    limits: Mapping[str, int]


async def read_reply(stream: LinkStream, expected: str) -> tuple[dict[str, Any], bytes]:
    """The first reply on ``stream`` and the bytes after it (RelayProtocolError if malformed)."""
    decoder, seen = ReplyDecoder(), 0
    while True:
        reply = decoder.next_reply(expected)
        if reply is not None:
            return reply, decoder.take_unconsumed()
        chunk = await stream.receive()
        if not chunk:
            raise RelayProtocolError("relay stream ended before its reply", code="bad_reply")
        seen += len(chunk)
        if seen > MAX_REPLY_READ_BYTES:
            raise RelayProtocolError("no reply within the first bytes of the relay stream", code="bad_reply")
        decoder.receive_data(chunk)


class RelayServer:
    """Handlers for ``relay_reserve`` and ``relay_connect`` streams. ``tamper`` (tests only) may
    rewrite the bytes the relay forwards, to show that the end-to-end link rejects them."""

    def __init__(self, limits: RelayLimits, *, tamper: Callable[[bytes], bytes] | None = None) -> None:
        self.book = RelayBook(limits)
        self._bucket = TokenBucket(limits.bytes_per_s, limits.burst_bytes)
        self._links: dict[str, Any] = {}  # reserving node id -> the PeerLink its reservation came on
        self._tamper = tamper
        self.bytes_relayed = 0

    def statistics(self) -> RelayServerStatistics:
        lim = self.book.limits
        return RelayServerStatistics(
            reservations=self.book.reservations,
            circuits=self.book.circuits,
            circuits_opened=self.book.circuits_opened,
            circuits_idle_closed=self.book.circuits_idle_closed,
            bytes_relayed=self.bytes_relayed,
            refused=dict(self.book.refused),
            limits={
                "max_reservations": lim.max_reservations,
                "max_circuits": lim.max_circuits,
                "max_circuits_per_source": lim.max_circuits_per_source,
                "max_circuits_per_address": lim.max_circuits_per_address,
                "max_reservations_per_address": lim.max_reservations_per_address,
                "circuit_idle_s": int(lim.circuit_idle_s),
                "bytes_per_s": lim.bytes_per_s,
                "reservation_ttl_s": int(lim.reservation_ttl_s),
            },
        )

    async def serve_reserve(self, link: Any, header: Mapping[str, Any], stream: LinkStream) -> None:
        if header.get("v") != RELAY_VERSION:
            await _refuse(stream, "bad_relay_header", f"relay version {header.get('v')!r} is not {RELAY_VERSION}")
            return
        now = trio.current_time()
        try:
            expires = self.book.reserve(link.peer_id, now, link.remote_host)
        except RelayRefused as exc:
            await _refuse(stream, exc.code, str(exc))
            return
        self._links[link.peer_id] = link
        lim = self.book.limits
        log.info("event=relay_reserved peer=%s ttl_s=%d", link.peer_id[:16], lim.reservation_ttl_s)
        try:
            await stream.send(
                encode_reply(
                    "reserved", ttl_s=int(lim.reservation_ttl_s), bytes_per_s=lim.bytes_per_s, circuits=lim.max_circuits
                )
            )
            with trio.move_on_at(expires):
                while await stream.receive():  # the client sends nothing; its EOF ends the reservation
                    pass
        finally:
            peer_id = link.peer_id
            self.book.release(peer_id, expires)
            if self._links.get(peer_id) is link and not self.book.reserved(peer_id, trio.current_time()):
                del self._links[peer_id]

    async def serve_connect(self, link: Any, header: Mapping[str, Any], stream: LinkStream) -> None:
        try:
            target = parse_connect(header).target
            circuit: Circuit = self.book.open_circuit(link.peer_id, target, trio.current_time(), link.remote_host)
        except (RelayProtocolError, RelayRefused) as exc:
            await _refuse(stream, exc.code, str(exc))
            return
        idle = False
        try:
            idle = await self._connect(link, target, stream)
        finally:
            self.book.close_circuit(circuit, idle=idle)

    async def _connect(self, source_link: Any, target: str, stream: LinkStream) -> bool:
        """Set up and splice one circuit; True when it was closed for being idle."""
        source = source_link.peer_id
        target_link = self._links.get(target)
        if target_link is None or target_link.closed:
            await _refuse(stream, "no_reservation", "the target's link to this relay is gone")
            return False
        try:
            # what each end needs to punch a direct path: its own address and the other end's
            incoming = {
                "kind": INCOMING_KIND,
                "v": RELAY_VERSION,
                "from": source,
                **observed_fields(target_link.remote_host, source_link.remote_host),
            }
            async with target_link.open_stream(incoming) as out:
                with trio.fail_after(RELAY_REPLY_TIMEOUT_S):
                    reply, rest = await read_reply(out, "accepted")
                if reply["op"] == "refused":
                    await _refuse(stream, reply["code"], reply["message"])
                    return False
                observed = observed_fields(source_link.remote_host, target_link.remote_host)
                await stream.send(encode_reply("connected", **observed))
                log.info("event=relay_circuit_open source=%s target=%s", source[:16], target[:16])
                idle = await self._splice(stream, out, rest)
                if idle:
                    log.info("event=relay_circuit_idle source=%s target=%s", source[:16], target[:16])
                return idle
        except (trio.TooSlowError, RelayProtocolError, StreamReset, LinkClosed) as exc:
            await _refuse(stream, "target_unreachable", f"{type(exc).__name__}: {exc}")
        return False

    async def _splice(self, a: LinkStream, b: LinkStream, b_first: bytes) -> bool:
        """Copy both directions until either ends badly (a clean EOF is passed on as EOF) or no byte
        passed either way for ``circuit_idle_s`` (both reset); True in that last case."""
        idle_s = self.book.limits.circuit_idle_s
        splice = _Splice(trio.current_time())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, a, b, b"", splice, nursery.cancel_scope)
            nursery.start_soon(self._pump, b, a, b_first, splice, nursery.cancel_scope)
            while trio.current_time() < splice.last_byte_at + idle_s:
                await trio.sleep_until(splice.last_byte_at + idle_s)
            splice.idle = True
            nursery.cancel_scope.cancel()
        if splice.idle:
            for s in (a, b):
                await s.reset("cancel", f"relayed circuit idle for {idle_s:g} s")
        return splice.idle

    async def _pump(
        self, src: LinkStream, dst: LinkStream, first: bytes, splice: _Splice, scope: trio.CancelScope
    ) -> None:
        try:
            chunk = first
            while True:
                if chunk:
                    splice.last_byte_at = trio.current_time()
                    delay = self._bucket.take(len(chunk), trio.current_time())
                    if delay > 0:
                        await trio.sleep(delay)
                    await dst.send(self._tamper(chunk) if self._tamper is not None else chunk)
                    self.bytes_relayed += len(chunk)
                    splice.last_byte_at = trio.current_time()
                chunk = await src.receive()
                if not chunk:
                    await dst.send_eof()
                    splice.ended += 1
                    if splice.ended == 2:  # both directions done: nothing left to watch
                        scope.cancel()
                    return
        except (StreamReset, LinkClosed):
            await src.reset("cancel", "relayed peer gone")
            await dst.reset("cancel", "relayed peer gone")
            scope.cancel()


@dataclass
class _Splice:
    """One circuit's splice: when a byte last passed, directions ended, whether it went idle."""

    last_byte_at: float
    ended: int = 0
    idle: bool = False


async def _refuse(stream: LinkStream, code: str, message: str) -> None:
    log.info("event=relay_refused reason=%s detail=%r", code, message)
    try:
        await stream.send(encode_reply("refused", code=code, message=message[:200]))
    except (StreamReset, LinkClosed):
        pass
