"""llama.cpp RPC through encrypted mesh tunnels, and worker leases.

Workers listen on 127.0.0.1 only.  A coordinator reaches a remote worker like this::

    runner (llama.cpp) ──TCP──▶ 127.0.0.1:T  (RemoteWorkerTunnel, coordinator node)
        ══ mesh stream {"kind": "tunnel", "service": "rpc", "op": "connect"} ══▶
    worker node (RpcTunnelServer) ──TCP──▶ 127.0.0.1:W (its RPC worker)

Before any ``connect`` stream, the coordinator holds a **lease stream**
(``"op": "lease"``) to the worker's node: the worker node grants it to one coordinator
at a time (a second gets the stream reset with code ``lease_held`` and a message naming
the holder) and answers with one JSON line describing the worker (``proto``,
``free_bytes``, ``device``).  The lease lasts exactly as long as that stream: the
coordinator ending it, the link closing, or the worker node restarting its worker all end
it.  ``connect`` streams from anyone but the holder are reset (``not_leased``).

Bytes are pumped both ways; backpressure is the link's per-stream credit window
(``STREAM_WINDOW_BYTES``): a pump ``send`` waits until the peer has credit.  The pump
reading llama.cpp's side cuts its bytes into link frames where ggml RPC messages end
(``framing.RpcFramer``): one frame per awaited request or reply instead of one per TCP
read, which is what makes a tunnel nearly as fast as a direct connection.  When either
side of a spliced connection ends or fails, both are closed: llama.cpp then sees its
socket close and aborts its runner, which the node restarts with a new plan.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from dataclasses import dataclass
from typing import Awaitable, Callable

import trio

from hydra_node.mesh.constants import DATA_CHUNK_BYTES
from hydra_node.mesh.errors import FrameRejected, LinkClosed, MeshError, StreamReset

from ._proto import ProtoVersion, RPC_PROTO
from . import native_pump
from .dataconn import (DataConnError, DataConnection, DataListener, TooManyTickets, dial, parse_offer)
from .framing import HOLD_S, PARTIAL_HOLD_S, Direction, RpcFramer
from .lease import LeaseHeld, WorkerLease

log = logging.getLogger("hydra.rpc.tunnel")

TUNNEL_SERVICE = "rpc"
#: Bytes read from a TCP socket per send on the stream (one DATA frame).
PUMP_CHUNK_BYTES = DATA_CHUNK_BYTES
#: Concurrent TCP connections one tunnel accepts (llama.cpp uses one per worker, plus its probe).
MAX_CONNECTIONS_PER_TUNNEL = 4
#: Longest lease reply line.
MAX_LEASE_REPLY_BYTES = 4096
#: How long the worker node may take to answer a lease request.
LEASE_TIMEOUT_S = 5.0
#: Pause after a failed accept() on a tunnel port.
ACCEPT_RETRY_S = 0.1
#: Longest lease tag (coordinators use the model id: one lease per coordinating runner).
MAX_TAG_CHARS = 128
#: Bound on connecting to the local worker port.
LOCAL_CONNECT_TIMEOUT_S = 3.0
#: Longest data-connection offer line, and how long each side waits for the other's line.
MAX_OFFER_BYTES = 1024
PATH_CHOICE_TIMEOUT_S = 15.0

_STREAM_ERRORS = (StreamReset, LinkClosed)
_TCP_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


class TunnelError(Exception):
    """A remote worker cannot be used through its tunnel (the message says why)."""

    def __init__(self, peer_id: str, message: str, code: str = "unavailable"):
        super().__init__(f"RPC worker on peer {peer_id[:16]}: {message}")
        self.peer_id, self.code = peer_id, code


@dataclass(frozen=True)
class LeasedWorker:
    """A remote worker this coordinator holds the lease on, as its node described it."""

    peer_id: str
    endpoint: str          # the local tunnel port llama.cpp should use
    proto: ProtoVersion
    free_bytes: int
    device: str


# ---------------------------------------------------------------- splicing
async def _pump_framed(tcp: trio.SocketStream, send, framer: RpcFramer) -> None:
    """TCP -> ``send``, cutting where ``framer`` says (held bytes go after a quiet spell).

    The socket's receive low-water mark follows ``framer.wanted``, so epoll reports it
    readable once the part of a message being read is complete (llama.cpp writes a
    request in three ``send()`` calls): one wake-up per part, not per ``send()``.  A
    non-blocking read still returns whatever is there, and end-of-stream always wakes.
    """
    lowat, relaxed = 1, False
    while True:
        want = 1 if relaxed else framer.wanted
        if want != lowat:
            lowat = want
            with contextlib.suppress(OSError):
                tcp.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
        if framer.held or lowat > 1:
            data = None
            with trio.move_on_after(HOLD_S if framer.between_messages else PARTIAL_HOLD_S):
                data = await tcp.receive_some(PUMP_CHUNK_BYTES)
            if data is None:  # quiet: send what is held, and take any bytes that come next
                if framer.held:
                    await send(framer.flush())
                relaxed = True
                continue
        else:
            data = await tcp.receive_some(PUMP_CHUNK_BYTES)
        relaxed = False
        if not data:
            if framer.held:
                await send(framer.flush())
            return
        if ready := framer.feed(data):
            await send(ready)


async def _first_to_end(*pumps: Callable[[], Awaitable[str]]) -> str:
    """Run ``pumps`` until the first one returns (how its side ended); cancel the rest.

    ggml RPC is request/response: once one direction ends, the other is of no use.
    """
    ended = "cancelled"
    async with trio.open_nursery() as nursery:
        async def run(pump: Callable[[], Awaitable[str]]) -> None:
            nonlocal ended
            ended = await pump()
            nursery.cancel_scope.cancel()

        for pump in pumps:
            nursery.start_soon(run, pump)
    return ended


def _how(exc: BaseException) -> str:
    if isinstance(exc, FrameRejected):
        log.warning("event=tunnel_data_frame_rejected reason=%s detail=%r", exc.code, str(exc))
        return f"data: {exc.code}"
    if isinstance(exc, _STREAM_ERRORS):
        return f"stream: {exc}"
    return f"tcp: {type(exc).__name__}"


async def splice(tcp: trio.SocketStream, stream, direction: Direction | None = None, initial: bytes = b"") -> str:
    """Pump bytes both ways until either side ends or fails; return how it ended.

    ``direction`` names what the TCP side sends (``"request"``: llama.cpp's client,
    ``"response"``: a worker) so that its bytes cross the link in whole ggml RPC messages;
    None pumps every read as it comes.  On a clean end of one direction the other is cut
    too and the stream is reset by the caller's context.  ``initial`` is stream data
    already read (it goes to the TCP side first).
    """
    async def tcp_to_stream() -> str:
        try:
            if direction is None:
                while data := await tcp.receive_some(PUMP_CHUNK_BYTES):
                    await stream.send(data)
            else:
                await _pump_framed(tcp, stream.send, RpcFramer(direction, PUMP_CHUNK_BYTES))
            await stream.send_eof()
            return "eof"
        except _TCP_ERRORS + _STREAM_ERRORS as exc:
            return _how(exc)

    async def stream_to_tcp() -> str:
        try:
            if initial:
                await tcp.send_all(initial)
            while data := await stream.receive():
                await tcp.send_all(data)
            return "eof"
        except _TCP_ERRORS + _STREAM_ERRORS as exc:
            return _how(exc)

    try:
        return await _first_to_end(tcp_to_stream, stream_to_tcp)
    finally:
        # Also when cancelled (the tunnel or lease went away): llama.cpp must see its socket
        # close, or it waits for a reply forever.
        with trio.CancelScope(shield=True):
            await tcp.aclose()


async def _read_line(stream, limit: int) -> bytes:
    return (await _read_line_and_rest(stream, limit))[0]


async def _read_line_and_rest(stream, limit: int) -> tuple[bytes, bytes]:
    """One line from a stream, and whatever came after it in the same chunks."""
    buf = b""
    while b"\n" not in buf:
        chunk = await stream.receive()
        if not chunk:
            break
        buf += chunk
        if len(buf) > limit:
            raise ValueError(f"line longer than {limit} bytes")
    line, _, rest = buf.partition(b"\n")
    return line, rest


async def splice_data(tcp: trio.SocketStream, conn: DataConnection, control, direction: Direction) -> str:
    """Pump between ``tcp`` and a data connection until either ends or fails, or the
    ``control`` stream (the connection's link stream) ends; return how it ended.

    The native pump (``native_pump.py``) does it when built; else this Python one.
    """
    async def tcp_to_data() -> str:
        try:
            await _pump_framed(tcp, conn.send, RpcFramer(direction, PUMP_CHUNK_BYTES))
            return "eof"
        except _TCP_ERRORS as exc:
            return _how(exc)

    async def data_to_tcp() -> str:
        try:
            while data := await conn.receive():
                await tcp.send_all(data)
            return "data connection closed"
        except (FrameRejected,) + _TCP_ERRORS as exc:
            return _how(exc)

    async def watch_control() -> str:
        try:
            while await control.receive():
                pass  # nothing is expected after the path choice
            return "control stream ended"
        except _STREAM_ERRORS as exc:
            return f"control: {exc}"

    try:
        if conn.idle and native_pump.native() is not None:
            return await native_pump.pump(tcp, conn, control)
        return await _first_to_end(tcp_to_data, data_to_tcp, watch_control)
    finally:
        with trio.CancelScope(shield=True):
            await tcp.aclose()
            await conn.aclose()


# ---------------------------------------------------------------- coordinator side
class RemoteWorkerTunnel:
    """Hold the lease on one remote worker and a loopback listener that tunnels to it.

    ``info = await nursery.start(tunnel.run)`` returns a :class:`LeasedWorker` once the
    lease is held and the listener bound, or raises :class:`TunnelError`.  After that,
    ``run`` never raises: it returns when the lease ends (link lost, worker gone) or
    is cancelled (the coordinator dropped the plan).
    """

    def __init__(self, mesh, peer_id: str, tag: str = ""):
        self.mesh = mesh
        self.peer_id = peer_id
        self.tag = tag[:MAX_TAG_CHARS]
        self.connections = 0
        self.data_connections = 0          # connections carried by a data connection
        self.data_fallback: str | None = None  # why the last one used the link stream instead
        self.worker_offers_data = False        # the lease reply said the worker node takes data connections
        self.bytes_up = 0
        self.bytes_down = 0
        self.ended: str | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        peer = self.peer_id
        try:
            link = await self.mesh.link_to(peer)
        except MeshError as exc:
            raise TunnelError(peer, f"unreachable: {exc}", "unreachable") from None
        started = False
        try:
            async with link.open_stream({"kind": "tunnel", "service": TUNNEL_SERVICE, "op": "lease",
                                         "tag": self.tag}) as lease:
                try:
                    with trio.fail_after(LEASE_TIMEOUT_S):
                        reply = json.loads(await _read_line(lease, MAX_LEASE_REPLY_BYTES))
                    info = LeasedWorker(peer, "", ProtoVersion.parse(reply["proto"]), int(reply["free_bytes"]),
                                        str(reply.get("device", "")))
                    self.worker_offers_data = reply.get("data") is True
                except StreamReset as exc:
                    raise TunnelError(peer, f"lease refused: {exc}", exc.code or "refused") from None
                except trio.TooSlowError:
                    raise TunnelError(peer, f"no lease reply within {LEASE_TIMEOUT_S:.0f} s", "timeout") from None
                except (ValueError, KeyError, TypeError) as exc:
                    raise TunnelError(peer, f"bad lease reply: {exc}", "bad_reply") from None
                if not RPC_PROTO.accepts_worker(info.proto):
                    raise TunnelError(peer, f"RPC protocol {info.proto} is incompatible with ours {RPC_PROTO} "
                                            "(same major version and a minor version not above ours needed)",
                                      "incompatible")
                try:
                    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
                except OSError as exc:
                    raise TunnelError(peer, f"cannot open a loopback tunnel port: {exc}", "local") from None
                port = listeners[0].socket.getsockname()[1]
                info = LeasedWorker(peer, f"127.0.0.1:{port}", info.proto, info.free_bytes, info.device)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._accept_loop, listeners[0], link)
                    started = True
                    task_status.started(info)
                    log.info("event=rpc_tunnel_open peer=%s endpoint=%s", peer[:16], info.endpoint)
                    try:
                        while await lease.receive():
                            pass
                        self.ended = "worker node ended the lease"
                    except _STREAM_ERRORS as exc:
                        self.ended = str(exc)
                    nursery.cancel_scope.cancel()
        except _STREAM_ERRORS + (MeshError,) as exc:
            if not started:
                raise TunnelError(peer, f"lost during lease: {exc}", "unreachable") from None
            self.ended = str(exc)
        finally:
            if started:
                log.info("event=rpc_tunnel_closed peer=%s reason=%r", peer[:16], self.ended or "dropped")

    async def _accept_loop(self, listener: trio.SocketListener, link) -> None:
        limit = trio.CapacityLimiter(MAX_CONNECTIONS_PER_TUNNEL)
        async with listener, trio.open_nursery() as nursery:
            while True:
                try:
                    tcp = await listener.accept()
                except OSError as exc:  # e.g. out of file descriptors: retry, do not take the node down
                    log.warning("event=rpc_tunnel_accept_failed peer=%s error=%r", self.peer_id[:16], exc)
                    await trio.sleep(ACCEPT_RETRY_S)
                    continue
                if limit.borrowed_tokens >= MAX_CONNECTIONS_PER_TUNNEL:
                    log.warning("event=rpc_tunnel_refused peer=%s reason=too_many_connections", self.peer_id[:16])
                    await tcp.aclose()
                    continue
                nursery.start_soon(self._serve_connection, tcp, link, limit)

    async def _serve_connection(self, tcp: trio.SocketStream, link, limit: trio.CapacityLimiter) -> None:
        async with limit:
            self.connections += 1
            try:
                header = {"kind": "tunnel", "service": TUNNEL_SERVICE, "op": "connect", "tag": self.tag}
                if self.worker_offers_data:
                    header["data"] = 1
                async with link.open_stream(header) as s:
                    conn = await self._try_data_connection(link, s) if self.worker_offers_data else None
                    if conn is not None:
                        self.data_connections += 1
                        await s.send(b"data\n")
                        how, carrier = await splice_data(tcp, conn, s, "request"), conn
                    else:
                        if self.worker_offers_data:
                            await s.send(b"link\n")
                        how, carrier = await splice(tcp, s, "request"), s
                    self.bytes_up += carrier.bytes_sent
                    self.bytes_down += carrier.bytes_received
                log.debug("event=rpc_tunnel_connection_end peer=%s how=%s", self.peer_id[:16], how)
            except _STREAM_ERRORS + (MeshError,) + _TCP_ERRORS as exc:
                log.info("event=rpc_tunnel_connection_failed peer=%s error=%r", self.peer_id[:16], exc)
            finally:
                with trio.CancelScope(shield=True):
                    await tcp.aclose()

    async def _try_data_connection(self, link, stream) -> DataConnection | None:
        """Read the worker node's offer and dial its data port; None: use the link stream."""
        line = b""
        with trio.move_on_after(PATH_CHOICE_TIMEOUT_S):
            line = await _read_line(stream, MAX_OFFER_BYTES)
        try:
            port, ticket, secret = parse_offer(line)
        except (ValueError, KeyError, TypeError):
            self.data_fallback = "the worker node offered no data connection"
            return None
        host = link.remote_host
        if not host:
            self.data_fallback = "the peer's address is unknown"
            return None
        try:
            return await dial(host, port, ticket, secret)
        except DataConnError as exc:
            self.data_fallback = str(exc)
            log.warning("event=rpc_tunnel_data_fallback peer=%s reason=%s error=%r", self.peer_id[:16],
                        exc.code, str(exc))
            return None


# ---------------------------------------------------------------- worker side
class RpcTunnelServer:
    """Serves ``tunnel``/``rpc`` streams on the node that owns a worker.

    ``worker_info()`` returns ``(endpoint, proto, free_bytes, device)`` of the local worker
    when it is ready, else None.
    """

    def __init__(self, worker_id: str, worker_info: Callable[[], tuple[str, str, int, str] | None]):
        self.lease = WorkerLease(worker_id)
        self.data = DataListener()
        self.worker_info = worker_info
        self._holders: dict[str, int] = {}        # coordinator -> open lease streams
        self._streams: set = set()                 # every stream we serve, for revoke()
        self.counters = {"leases_granted": 0, "leases_refused": 0, "connections": 0, "connections_refused": 0,
                         "data_connections": 0, "bytes_in": 0, "bytes_out": 0}

    async def serve_data(self, host: str, port: int = 0, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Accept tunnel data connections on ``host`` (the mesh listener's address)."""
        await self.data.serve(host, port, task_status=task_status)

    def holder(self) -> str | None:
        return self.lease.holder()

    async def handle(self, link, header: dict, stream) -> None:
        try:
            await self._handle(link, header, stream)
        finally:
            # End the stream here, never half-closed: the link's own end-of-handler clean-up
            # would otherwise race a reset or link close arriving at that moment.
            with trio.CancelScope(shield=True):
                await stream.reset("closed", "tunnel ended")

    async def _handle(self, link, header: dict, stream) -> None:
        op, tag = header.get("op"), header.get("tag", "")
        if not isinstance(tag, str) or len(tag) > MAX_TAG_CHARS:
            await stream.reset("refused", f"tag must be a string of at most {MAX_TAG_CHARS} characters")
            return
        # The holder is the authenticated peer plus its tag (one lease per coordinating runner).
        holder = f"{link.peer_id}/{tag}"
        if op == "lease":
            await self._serve_lease(holder, stream)
        elif op == "connect":
            await self._serve_connect(holder, stream, bool(header.get("data")))
        else:
            await stream.reset("refused", f"unknown rpc tunnel op {op!r}")

    async def revoke(self, why: str) -> None:
        """The worker restarted (its state is gone): end every lease and connection."""
        holder = self.lease.revoke()
        self._holders.clear()
        for s in list(self._streams):
            await s.reset("worker_restarted", why)
        if holder:
            log.warning("event=rpc_lease_revoked coordinator=%s reason=%r", holder[:16], why)

    async def _serve_lease(self, peer: str, stream) -> None:
        info = self.worker_info()
        if info is None:
            self.counters["leases_refused"] += 1
            await stream.reset("worker_unavailable", "this node's RPC worker is not ready")
            return
        try:
            self.lease.acquire(peer)
        except LeaseHeld as exc:
            self.counters["leases_refused"] += 1
            log.info("event=rpc_lease_refused coordinator=%s holder=%s", peer[:16], exc.holder[:16])
            await stream.reset("lease_held", f"RPC worker is leased to coordinator {exc.holder[:16]}; "
                                             "pick another worker or wait")
            return
        self.counters["leases_granted"] += 1
        self._holders[peer] = self._holders.get(peer, 0) + 1
        self._streams.add(stream)
        log.info("event=rpc_lease_granted coordinator=%s", peer[:16])
        try:
            _, proto, free, device = info
            await stream.send(json.dumps({"proto": proto, "free_bytes": free, "device": device,
                                          "data": self.data.port is not None}).encode() + b"\n")
            while await stream.receive():
                pass
        finally:
            self._streams.discard(stream)
            left = self._holders.get(peer, 0) - 1
            if left > 0:
                self._holders[peer] = left
            else:
                self._holders.pop(peer, None)
                if self.lease.holder() == peer:
                    self.lease.release(peer)
                    log.info("event=rpc_lease_released coordinator=%s", peer[:16])

    async def _serve_connect(self, peer: str, stream, header_wants_data: bool = False) -> None:
        if self.lease.holder() != peer:
            self.counters["connections_refused"] += 1
            await stream.reset("not_leased", "open a lease stream first; the RPC worker serves its lease holder only")
            return
        info = self.worker_info()
        if info is None:
            await stream.reset("worker_unavailable", "this node's RPC worker is not ready")
            return
        host, _, port = info[0].rpartition(":")
        try:
            with trio.fail_after(LOCAL_CONNECT_TIMEOUT_S):
                tcp = await trio.open_tcp_stream(host, int(port))
        except (OSError, trio.TooSlowError) as exc:
            await stream.reset("worker_unavailable", f"cannot reach the local RPC worker: {exc}")
            return
        self.counters["connections"] += 1
        self._streams.add(stream)
        carrier = stream
        try:
            conn, initial = await self._choose_path(peer, stream, header_wants_data)
            if conn is not None:
                self.counters["data_connections"] += 1
                carrier = conn
                await splice_data(tcp, conn, stream, "response")
            else:
                await splice(tcp, stream, "response", initial=initial)
        finally:
            self._streams.discard(stream)
            self.counters["bytes_in"] += carrier.bytes_received
            self.counters["bytes_out"] += carrier.bytes_sent
            with trio.CancelScope(shield=True):
                await tcp.aclose()  # _choose_path may fail before a splice owns it

    async def _choose_path(self, peer: str, stream, wants_data: bool) -> tuple[DataConnection | None, bytes]:
        """Offer a data connection (when asked and possible); return it, or None and the
        stream bytes that followed the coordinator's ``link`` choice."""
        if not wants_data:
            return None, b""
        ticket = waiter = None
        if self.data.port is not None:
            try:
                ticket, waiter = self.data.issue(peer)
            except TooManyTickets:
                pass
        offer = ticket.offer(self.data.port) if ticket is not None else {}
        try:
            await stream.send(json.dumps(offer).encode() + b"\n")
            line, rest = b"", b""
            with trio.move_on_after(PATH_CHOICE_TIMEOUT_S):
                line, rest = await _read_line_and_rest(stream, MAX_OFFER_BYTES)
            if line == b"data" and waiter is not None:
                with trio.move_on_after(LOCAL_CONNECT_TIMEOUT_S):
                    try:
                        conn = await waiter.receive()
                        conn.taken.set()
                        return conn, b""
                    except trio.EndOfChannel:
                        pass  # the listener refused the connection (logged and counted there)
                await stream.reset("refused", "no valid data connection arrived for the ticket")
                raise StreamReset("data connection missing", code="refused")
            if line != b"link":
                await stream.reset("refused", f"expected 'data' or 'link', got {line[:32]!r}")
                raise StreamReset("bad path choice", code="refused")
            return None, rest
        finally:
            if ticket is not None:
                self.data.withdraw(ticket)

    def status(self) -> dict:
        return {"leased_to": self.lease.holder(), "counters": dict(self.counters), "data": self.data.status()}


TunnelHandler = Callable[[object, dict, object], Awaitable[None]]
