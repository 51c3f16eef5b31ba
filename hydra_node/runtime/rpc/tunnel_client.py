"""The coordinator side of a tunnel: hold a remote worker's lease and tunnel llama.cpp to it.

:class:`RemoteWorkerTunnel` opens the lease stream, then a loopback listener; each TCP
connection llama.cpp makes to it becomes a ``connect`` stream to the worker's node, spliced
through a direct data connection when the worker node offers one, else through the stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from hydra_node.mesh.wire.errors import MeshError, StreamReset

from hydra_node.runtime.rpc.proto import RPC_PROTO, ProtoVersion
from hydra_node.runtime.rpc.dataconn import DataConnError, DataConnection, dial
from hydra_node.runtime.rpc.lease_wire import (
    ControlError,
    DataOffer,
    LeaseGranted,
    NoDataOffer,
    PathChoice,
    encode_control,
)
from hydra_node.runtime.rpc.tunnel_control import MAX_TAG_CHARS, PATH_CHOICE_TIMEOUT_S, TUNNEL_SERVICE, read_control
from hydra_node.runtime.rpc.tunnel_splice import STREAM_ERRORS, TCP_ERRORS, splice, splice_data

__all__ = [
    "ACCEPT_RETRY_S",
    "LEASE_TIMEOUT_S",
    "MAX_CONNECTIONS_PER_TUNNEL",
    "LeasedWorker",
    "LinkDialer",
    "RemoteWorkerTunnel",
    "TunnelError",
]

log = logging.getLogger("hydra.rpc.tunnel")

#: Concurrent TCP connections one tunnel accepts (llama.cpp uses one per worker, plus its probe).
MAX_CONNECTIONS_PER_TUNNEL = 4
#: How long the worker node may take to answer a lease request.
LEASE_TIMEOUT_S = 5.0
#: Pause after a failed accept() on a tunnel port.
ACCEPT_RETRY_S = 0.1


class TunnelError(Exception):
    """A remote worker cannot be used through its tunnel (the message says why)."""

    def __init__(self, peer_id: str, message: str, code: str = "unavailable"):
        super().__init__(f"RPC worker on peer {peer_id[:16]}: {message}")
        self.peer_id, self.code = peer_id, code


@dataclass(frozen=True)
class LeasedWorker:
    """A remote worker this coordinator holds the lease on, as its node described it."""

    peer_id: str
    endpoint: str  # the local tunnel port llama.cpp should use
    proto: ProtoVersion
    free_bytes: int
    device: str


class LinkDialer(Protocol):
    """All a tunnel needs of the mesh: a link to the worker's node (dialled if needed)."""

    async def link_to(self, peer_id: str) -> Any: ...


class RemoteWorkerTunnel:
    """Hold the lease on one remote worker and a loopback listener that tunnels to it.

    ``info = await nursery.start(tunnel.run)`` returns a :class:`LeasedWorker` once the
    lease is held and the listener bound, or raises :class:`TunnelError`.  After that,
    ``run`` never raises: it returns when the lease ends (link lost, worker gone) or
    is cancelled (the coordinator dropped the plan).
    """

    def __init__(self, mesh: "LinkDialer", peer_id: str, tag: str = ""):
        self.mesh = mesh
        self.peer_id = peer_id
        self.tag = tag[:MAX_TAG_CHARS]
        self.connections = 0
        self.data_connections = 0  # connections carried by a data connection
        self.data_fallback: str | None = None  # why the last one used the link stream instead
        self.worker_offers_data = False  # the lease reply said the worker node takes data connections
        self.bytes_up = 0
        self.bytes_down = 0
        self.ended: str | None = None

    async def run(self, *, task_status: trio.TaskStatus[LeasedWorker] = trio.TASK_STATUS_IGNORED) -> None:
        peer = self.peer_id
        try:
            link = await self.mesh.link_to(peer)
        except MeshError as exc:
            raise TunnelError(peer, f"unreachable: {exc}", "unreachable") from None
        started = False
        try:
            async with link.open_stream(
                {"kind": "tunnel", "service": TUNNEL_SERVICE, "op": "lease", "tag": self.tag}
            ) as lease:
                try:
                    with trio.fail_after(LEASE_TIMEOUT_S):
                        grant, _ = await read_control(lease, LeaseGranted)
                    info = LeasedWorker(peer, "", grant.proto, grant.free_bytes, grant.device)
                    self.worker_offers_data = grant.data
                except StreamReset as exc:
                    raise TunnelError(peer, f"lease refused: {exc}", exc.code or "refused") from None
                except trio.TooSlowError:
                    raise TunnelError(peer, f"no lease reply within {LEASE_TIMEOUT_S:.0f} s", "timeout") from None
                except ControlError as exc:
                    raise TunnelError(peer, f"bad lease reply ({exc.code}): {exc}", "bad_reply") from None
                if not RPC_PROTO.accepts_worker(info.proto):
                    raise TunnelError(
                        peer,
                        f"RPC protocol {info.proto} is incompatible with ours {RPC_PROTO} "
                        "(same major version and a minor version not above ours needed)",
                        "incompatible",
                    )
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
                    except STREAM_ERRORS as exc:
                        self.ended = str(exc)
                    nursery.cancel_scope.cancel()
        except STREAM_ERRORS + (MeshError,) as exc:
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
                header: dict[str, object] = {
                    "kind": "tunnel",
                    "service": TUNNEL_SERVICE,
                    "op": "connect",
                    "tag": self.tag,
                }
                if self.worker_offers_data:
                    header["data"] = 1
                async with link.open_stream(header) as s:
                    conn = await self._try_data_connection(link, s) if self.worker_offers_data else None
                    if conn is not None:
                        self.data_connections += 1
                        await s.send(encode_control(PathChoice("data")))
                        how, carrier = await splice_data(tcp, conn, s, "request"), conn
                    else:
                        if self.worker_offers_data:
                            await s.send(encode_control(PathChoice("link")))
                        how, carrier = await splice(tcp, s, "request"), s
                    self.bytes_up += carrier.bytes_sent
                    self.bytes_down += carrier.bytes_received
                log.debug("event=rpc_tunnel_connection_end peer=%s how=%s", self.peer_id[:16], how)
            except STREAM_ERRORS + (MeshError,) + TCP_ERRORS as exc:
                log.info("event=rpc_tunnel_connection_failed peer=%s error=%r", self.peer_id[:16], exc)
            finally:
                with trio.CancelScope(shield=True):
                    await tcp.aclose()

    async def _try_data_connection(self, link, stream) -> DataConnection | None:
        """Read the worker node's offer and dial its data port; None: use the link stream."""
        offer = None
        with trio.move_on_after(PATH_CHOICE_TIMEOUT_S):
            try:
                offer, _ = await read_control(stream, DataOffer, NoDataOffer)
            except ControlError as exc:
                log.warning(
                    "event=rpc_tunnel_bad_offer peer=%s code=%s error=%r", self.peer_id[:16], exc.code, str(exc)
                )
        if not isinstance(offer, DataOffer):
            self.data_fallback = "the worker node offered no data connection"
            return None
        port, ticket, secret = offer.port, offer.ticket, offer.secret
        host = link.remote_host
        if not host:
            self.data_fallback = "the peer's address is unknown"
            return None
        try:
            return await dial(host, port, ticket, secret)
        except DataConnError as exc:
            self.data_fallback = str(exc)
            log.warning(
                "event=rpc_tunnel_data_fallback peer=%s reason=%s error=%r", self.peer_id[:16], exc.code, str(exc)
            )
            return None
