"""The worker side of a tunnel: grant the lease on this node's worker and serve its connections.

:class:`RpcTunnelServer` handles the ``tunnel``/``rpc`` streams a coordinator opens: one
lease holder at a time; ``connect`` streams only from the holder, each spliced to the local
worker port, through a direct data connection when the coordinator takes the offer.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import trio

from hydra_node.mesh.wire.errors import StreamReset

from hydra_node.runtime.rpc.proto import ProtoVersion
from hydra_node.runtime.rpc.dataconn import DataConnection, DataListener, TooManyTickets
from hydra_node.runtime.rpc.lease import LeaseHeld, LeaseRow, WorkerLease
from hydra_node.runtime.rpc.lease_wire import (
    MAX_DEVICE_CHARS,
    ControlError,
    DataOffer,
    LeaseGranted,
    NoDataOffer,
    PathChoice,
    encode_control,
)
from hydra_node.runtime.rpc.tunnel_control import MAX_TAG_CHARS, PATH_CHOICE_TIMEOUT_S, read_control
from hydra_node.runtime.rpc.tunnel_splice import splice, splice_data

__all__ = ["LOCAL_CONNECT_TIMEOUT_S", "RpcTunnelServer"]

log = logging.getLogger("hydra.rpc.tunnel")

#: Bound on connecting to the local worker port.
LOCAL_CONNECT_TIMEOUT_S = 3.0


class RpcTunnelServer:
    """Serves ``tunnel``/``rpc`` streams on the node that owns a worker.

    ``worker_info()`` returns ``(endpoint, proto, free_bytes, device)`` of the local worker
    when it is ready, else None.
    """

    def __init__(self, worker_id: str, worker_info: Callable[[], tuple[str, str, int, str] | None]):
        self.lease = WorkerLease(worker_id)
        self.data = DataListener()
        self.worker_info = worker_info
        self._holders: dict[str, int] = {}  # coordinator -> open lease streams
        self._streams: set = set()  # every stream we serve, for revoke()
        self.counters = {
            "leases_granted": 0,
            "leases_refused": 0,
            "connections": 0,
            "connections_refused": 0,
            "data_connections": 0,
            "bytes_in": 0,
            "bytes_out": 0,
        }
        self._lease_bytes = [0, 0]  # (in, out) tunnelled for the current lease holder

    async def serve_data(
        self,
        host: str,
        port: int = 0,
        *,
        listeners: list[trio.SocketListener] | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept tunnel data connections on ``host`` (the mesh listener's address); ``listeners``:
        that port bound beforehand."""
        await self.data.serve(host, port, listeners=listeners, task_status=task_status)

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
            fresh = self.lease.holder() != peer
            self.lease.acquire(peer, now=time.time())
            if fresh:
                self._lease_bytes = [0, 0]
        except LeaseHeld as exc:
            self.counters["leases_refused"] += 1
            log.info("event=rpc_lease_refused coordinator=%s holder=%s", peer[:16], exc.holder[:16])
            await stream.reset(
                "lease_held", f"RPC worker is leased to coordinator {exc.holder[:16]}; pick another worker or wait"
            )
            return
        self.counters["leases_granted"] += 1
        self._holders[peer] = self._holders.get(peer, 0) + 1
        self._streams.add(stream)
        log.info("event=rpc_lease_granted coordinator=%s", peer[:16])
        try:
            _, proto, free, device = info
            await stream.send(
                encode_control(
                    LeaseGranted(ProtoVersion.parse(proto), free, device[:MAX_DEVICE_CHARS], self.data.port is not None)
                )
            )
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
            self._lease_bytes[0] += carrier.bytes_received
            self._lease_bytes[1] += carrier.bytes_sent
            with trio.CancelScope(shield=True):
                await tcp.aclose()  # _choose_path may fail before a splice owns it

    async def _choose_path(self, peer: str, stream, wants_data: bool) -> tuple[DataConnection | None, bytes]:
        """Offer a data connection (when asked and possible); return it, or None and the
        stream bytes that followed the coordinator's ``link`` choice."""
        if not wants_data:
            return None, b""
        ticket = waiter = None
        port = self.data.port
        if port is not None:
            try:
                ticket, waiter = self.data.issue(peer)
            except TooManyTickets:
                pass
        offer = (
            DataOffer(port, ticket.ticket_id, ticket.secret)
            if port is not None and ticket is not None
            else NoDataOffer()
        )
        try:
            await stream.send(encode_control(offer))
            choice, rest = None, b""
            with trio.move_on_after(PATH_CHOICE_TIMEOUT_S):
                try:
                    choice, rest = await read_control(stream, PathChoice)
                except ControlError as exc:
                    await stream.reset("refused", f"bad path choice ({exc.code}): {exc}"[:200])
                    raise StreamReset("bad path choice", code="refused") from None
            via = choice.via if choice is not None else None
            if via == "data" and waiter is not None:
                with trio.move_on_after(LOCAL_CONNECT_TIMEOUT_S):
                    try:
                        conn = await waiter.receive()
                        conn.taken.set()
                        return conn, b""
                    except trio.EndOfChannel:
                        pass  # the listener refused the connection (logged and counted there)
                await stream.reset("refused", "no valid data connection arrived for the ticket")
                raise StreamReset("data connection missing", code="refused")
            if via != "link":
                await stream.reset("refused", f"expected a path choice 'data' or 'link', got {via!r}")
                raise StreamReset("bad path choice", code="refused")
            return None, rest
        finally:
            if ticket is not None:
                self.data.withdraw(ticket)

    def leases(self) -> list[LeaseRow]:
        """Who holds a lease on this node's worker (``/api/status`` ``rpc_worker.leases``)."""
        row = self.lease.row(bytes_in=self._lease_bytes[0], bytes_out=self._lease_bytes[1])
        return [row] if row is not None else []

    def status(self) -> dict:
        return {"leased_to": self.lease.holder(), "counters": dict(self.counters), "data": self.data.status()}
