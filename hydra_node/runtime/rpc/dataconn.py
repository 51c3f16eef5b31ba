"""Tunnel data connections: one encrypted TCP connection per RPC tunnel connection.

A tunnel connection first exists as a ``connect`` stream on the encrypted peer link
(``tunnel.py``).  When the worker node offers it, the coordinator then moves that
connection's bytes onto a TCP connection of its own to the worker node's *data port*:
no websocket framing, no multiplexing and one task per direction, which costs a
fraction of a link frame per message (``bench/split.py``).  The link stream stays open
as the connection's control: when it ends, the data connection is closed too.

How it is secured (protocol/README.md, "Tunnel data connections")::

    worker node --(connect stream, encrypted link)--> {"data_port": P, "ticket": hex16, "secret": hex32}
    coordinator --TCP--> worker node:P
        MAGIC || ticket || u32 len || seal_c2w(b"")         (proves it knows the secret)
        <-- u32 len || seal_w2c(b"")                        (the worker node accepts)
        then u32 len || seal(data) frames both ways

The ticket and the 32-byte secret travel only inside the authenticated, encrypted link
stream, are single-use and expire after ``TICKET_TTL_S``.  Keys per direction are
BLAKE2b-256 of the secret with personalisations ``hydra-tun-c2w`` / ``hydra-tun-w2c``;
frames are :class:`~hydra_node.mesh.wire.secure_channel.SecureChannel` frames (counter + XChaCha20-
Poly1305), so replayed, reordered, tampered or oversized frames are rejected (typed,
counted) and end the connection.  Everything sans-IO lives in this module's first half;
the trio part is :class:`DataListener` and :func:`dial`.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import struct
from dataclasses import dataclass, field

import trio

from hydra_node.mesh.wire.secure_channel import SecureChannel
from hydra_node.mesh.wire.constants import FRAME_OVERHEAD_BYTES
from hydra_node.mesh.wire.errors import FrameRejected

log = logging.getLogger("hydra.rpc.dataconn")

MAGIC = b"HYDRA-TUNNEL/1\n"
TICKET_BYTES = 16
SECRET_BYTES = 32
#: Largest plaintext of one data frame (what a pump sends at once).
MAX_DATA_PLAINTEXT = 64 * 1024
MAX_DATA_FRAME = MAX_DATA_PLAINTEXT + FRAME_OVERHEAD_BYTES
LENGTH = struct.Struct(">I")
#: How long an offered ticket waits for its data connection.
TICKET_TTL_S = 10.0
#: Offered tickets not yet used, per worker node.
MAX_OUTSTANDING_TICKETS = 16
#: Bound on the preamble + hello of an accepted data connection, and on the dialler's wait.
DATA_HANDSHAKE_TIMEOUT_S = 3.0
#: Accepted data connections still in their handshake.
MAX_HANDSHAKING = 16


class DataConnError(Exception):
    """A data connection could not be set up or broke (``code`` says how; logged, counted)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- sans-IO
def direction_keys(secret: bytes) -> tuple[bytes, bytes]:
    """``(coordinator->worker, worker->coordinator)`` keys of a ticket's secret."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"a data-connection secret has {SECRET_BYTES} bytes")
    return tuple(
        hashlib.blake2b(b"", digest_size=32, key=secret, person=p).digest()  # type: ignore[return-value]
        for p in (b"hydra-tun-c2w", b"hydra-tun-w2c")
    )


def channel_for(secret: bytes, side: str) -> SecureChannel:
    """The frame channel of ``side`` ("coordinator" or "worker")."""
    c2w, w2c = direction_keys(secret)
    if side == "coordinator":
        return SecureChannel(c2w, w2c, max_frame=MAX_DATA_FRAME)
    if side == "worker":
        return SecureChannel(w2c, c2w, max_frame=MAX_DATA_FRAME)
    raise ValueError("side is 'coordinator' or 'worker'")


def seal_frame(channel: SecureChannel, plaintext: bytes) -> bytes:
    """``u32 length || SecureChannel frame``."""
    sealed = channel.seal(plaintext)
    return LENGTH.pack(len(sealed)) + sealed


class FrameReader:
    """Split a byte stream into data frames and open them; FrameRejected on anything bad."""

    def __init__(self, channel: SecureChannel) -> None:
        self._channel = channel
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out = []
        while len(self._buf) >= LENGTH.size:
            (n,) = LENGTH.unpack_from(self._buf)
            if n > MAX_DATA_FRAME:
                raise FrameRejected(f"data frame of {n} bytes exceeds {MAX_DATA_FRAME}", code="oversize")
            if len(self._buf) < LENGTH.size + n:
                break
            frame = bytes(self._buf[LENGTH.size : LENGTH.size + n])
            del self._buf[: LENGTH.size + n]
            out.append(self._channel.open(frame))
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)


@dataclass(frozen=True)
class Ticket:
    ticket_id: bytes
    secret: bytes
    holder: str  # the lease holder it was offered to
    expires_at: float


class TooManyTickets(Exception):
    pass


@dataclass
class TicketBook:
    """Single-use tickets with a deadline; ``now`` is passed in (monotonic seconds)."""

    ttl_s: float = TICKET_TTL_S
    max_outstanding: int = MAX_OUTSTANDING_TICKETS
    _tickets: dict[bytes, Ticket] = field(default_factory=dict)

    def issue(self, holder: str, now: float, *, random=os.urandom) -> Ticket:
        self._expire(now)
        if len(self._tickets) >= self.max_outstanding:
            raise TooManyTickets(f"{self.max_outstanding} data-connection tickets are outstanding")
        t = Ticket(random(TICKET_BYTES), random(SECRET_BYTES), holder, now + self.ttl_s)
        self._tickets[t.ticket_id] = t
        return t

    def claim(self, ticket_id: bytes, now: float) -> Ticket | None:
        """The ticket, removed (single use); None if unknown or expired."""
        self._expire(now)
        return self._tickets.pop(ticket_id, None)

    def cancel(self, ticket_id: bytes) -> None:
        self._tickets.pop(ticket_id, None)

    def _expire(self, now: float) -> None:
        for tid in [tid for tid, t in self._tickets.items() if t.expires_at <= now]:
            del self._tickets[tid]

    def __len__(self) -> int:
        return len(self._tickets)


# ---------------------------------------------------------------- trio
class DataConnection:
    """An established data connection: ``send(plaintext)``, ``receive() -> plaintexts``."""

    def __init__(self, tcp: trio.SocketStream, channel: SecureChannel, reader: FrameReader | None = None):
        self.tcp = tcp
        self._channel = channel
        self._reader = reader or FrameReader(channel)
        self._pending: collections.deque[bytes] = collections.deque()
        self.bytes_sent = 0
        self.bytes_received = 0
        self.taken = trio.Event()  # the connect stream's handler took it over
        self.closed = trio.Event()

    def keys(self) -> tuple[bytes, bytes]:
        return self._channel.keys()

    @property
    def send_counter(self) -> int:
        return self._channel.send_counter

    @property
    def receive_counter(self) -> int:
        return self._channel.receive_counter

    @property
    def idle(self) -> bool:
        """Nothing received but not yet returned (a native pump may take over)."""
        return not self._pending and not self._reader.buffered

    async def send(self, data: bytes) -> None:
        for i in range(0, len(data), MAX_DATA_PLAINTEXT):
            piece = data[i : i + MAX_DATA_PLAINTEXT]
            await self.tcp.send_all(seal_frame(self._channel, piece))
            self.bytes_sent += len(piece)

    async def receive(self) -> bytes:
        """The next plaintext; b"" at the peer's end of stream.  FrameRejected if bad."""
        while not self._pending:
            data = await self.tcp.receive_some(MAX_DATA_FRAME)
            if not data:
                if self._reader.buffered:
                    raise FrameRejected("data connection ended inside a frame", code="bad_frame")
                return b""
            self._pending.extend(p for p in self._reader.feed(data) if p)
        chunk = self._pending.popleft()
        self.bytes_received += len(chunk)
        return chunk

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.tcp.aclose()
        self.closed.set()


async def dial(
    host: str, port: int, ticket_id: bytes, secret: bytes, timeout_s: float = DATA_HANDSHAKE_TIMEOUT_S
) -> DataConnection:
    """Coordinator side: connect, prove the ticket, wait for the worker node's accept."""
    channel = channel_for(secret, "coordinator")
    try:
        with trio.fail_after(timeout_s):
            tcp = await trio.open_tcp_stream(host, port)
            try:
                await tcp.send_all(MAGIC + ticket_id + seal_frame(channel, b""))
                reader = FrameReader(channel)
                while True:
                    data = await tcp.receive_some(MAX_DATA_FRAME)
                    if not data:
                        raise DataConnError("the worker node closed the data connection (ticket refused)", "refused")
                    if reader.feed(data):  # the (empty) accept frame
                        return DataConnection(tcp, channel, reader)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await tcp.aclose()
                raise
    except trio.TooSlowError:
        raise DataConnError(
            f"no data-connection accept from {host}:{port} within {timeout_s:.0f} s", "timeout"
        ) from None
    except OSError as exc:
        raise DataConnError(f"cannot reach data port {host}:{port}: {exc}", "unreachable") from None
    except FrameRejected as exc:
        raise DataConnError(f"bad accept frame: {exc}", exc.code) from None


class DataListener:
    """Worker-node side: accept data connections and hand each to the ticket's waiter.

    ``issue(holder)`` returns a ticket and a receive channel that yields the
    :class:`DataConnection` once the coordinator connected with that ticket.  Connections with an unknown,
    expired or used ticket, a bad magic or a hello that fails authentication are closed
    and counted in ``rejected`` (by code).
    """

    def __init__(self) -> None:
        self.book = TicketBook()
        self.port: int | None = None
        self._waiters: dict[bytes, trio.MemorySendChannel] = {}
        self._handshaking = 0
        self.accepted = 0
        self.rejected: collections.Counter[str] = collections.Counter()

    def issue(self, holder: str) -> tuple[Ticket, trio.MemoryReceiveChannel]:
        ticket = self.book.issue(holder, trio.current_time())
        send, receive = trio.open_memory_channel(1)
        self._waiters[ticket.ticket_id] = send
        return ticket, receive

    def withdraw(self, ticket: Ticket) -> None:
        self.book.cancel(ticket.ticket_id)
        send = self._waiters.pop(ticket.ticket_id, None)
        if send is not None:
            send.close()

    async def serve(
        self,
        host: str,
        port: int = 0,
        *,
        listeners: list[trio.SocketListener] | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept data connections on ``listeners`` (bound beforehand on ``host``), else on ``host:port``."""
        if listeners is None:
            listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("event=tunnel_data_listener_up host=%s port=%s", host, self.port)
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    def _reject(self, code: str, detail: str) -> None:
        self.rejected[code] += 1
        log.warning("event=tunnel_data_rejected reason=%s detail=%r", code, detail)

    async def _handle(self, tcp: trio.SocketStream) -> None:
        # trio closes the connection when this handler returns: a connection in use keeps
        # its handler waiting until the tunnel closes it.
        if self._handshaking >= MAX_HANDSHAKING:
            self._reject("busy", "too many data connections in their handshake")
            return
        self._handshaking += 1
        try:
            conn, waiter = await self._accept(tcp)
        except Exception as exc:  # a bad connection must never reach the listener's nursery
            self._reject("internal_error", repr(exc))
            return
        finally:
            self._handshaking -= 1
        if conn is None:
            return
        try:
            waiter.send_nowait(conn)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self._reject("withdrawn", "the connect stream gave up on this ticket")
            return
        with trio.move_on_after(DATA_HANDSHAKE_TIMEOUT_S):
            await conn.taken.wait()
        if not conn.taken.is_set():
            self._reject("withdrawn", "the connect stream did not take the data connection")
            return
        self.accepted += 1
        await conn.closed.wait()

    async def _accept(self, tcp: trio.SocketStream):
        """Read and check ``MAGIC || ticket || hello``, answer with the accept frame;
        ``(connection, waiter)``, or ``(None, None)`` after a counted rejection."""
        buf = bytearray()

        async def fill(n: int) -> bool:  # at least n bytes in buf (a coordinator sends nothing past the hello)
            while len(buf) < n:
                data = await tcp.receive_some(MAX_DATA_FRAME)
                if not data:
                    return False
                buf.extend(data)
            return True

        head = len(MAGIC) + TICKET_BYTES + LENGTH.size
        with trio.move_on_after(DATA_HANDSHAKE_TIMEOUT_S) as scope:
            try:
                if not await fill(len(MAGIC)) or not buf.startswith(MAGIC):
                    self._reject("bad_magic", f"not a tunnel data connection: {bytes(buf[:16])!r}")
                    return None, None
                if not await fill(head):
                    self._reject("peer_closed", "closed during the data-connection hello")
                    return None, None
                (n,) = LENGTH.unpack_from(buf, head - LENGTH.size)
                if n > MAX_DATA_FRAME:
                    self._reject("oversize", "hello frame too large")
                    return None, None
                if not await fill(head + n):
                    self._reject("peer_closed", "closed during the data-connection hello")
                    return None, None
            except (OSError, trio.BrokenResourceError) as exc:
                self._reject("peer_closed", repr(exc))
                return None, None
        if scope.cancelled_caught:
            self._reject("timeout", f"no data-connection hello within {DATA_HANDSHAKE_TIMEOUT_S} s")
            return None, None
        ticket_id = bytes(buf[len(MAGIC) : len(MAGIC) + TICKET_BYTES])
        ticket = self.book.claim(ticket_id, trio.current_time())
        waiter = self._waiters.pop(ticket_id, None)
        if ticket is None or waiter is None:
            self._reject("bad_ticket", "unknown, used or expired ticket")
            return None, None
        channel = channel_for(ticket.secret, "worker")
        reader = FrameReader(channel)
        try:
            hello = reader.feed(bytes(buf[head - LENGTH.size :]))
        except FrameRejected as exc:
            waiter.close()
            self._reject(exc.code, f"hello: {exc}")
            return None, None
        if hello != [b""]:
            waiter.close()
            self._reject("bad_frame", "the hello must be one empty frame")
            return None, None
        try:
            await tcp.send_all(seal_frame(channel, b""))
        except (OSError, trio.BrokenResourceError) as exc:
            waiter.close()
            self._reject("peer_closed", repr(exc))
            return None, None
        return DataConnection(tcp, channel, reader), waiter

    def status(self) -> dict:
        return {
            "port": self.port,
            "outstanding_tickets": len(self.book),
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
        }
