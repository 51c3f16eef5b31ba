"""`GossipService`: the thin trio driver around the sans-IO `Membership` core.

It sleeps until `next_deadline()`, feeds `tick`, hands each `Send` to an injected
`send(peer_id, wire_dict)` coroutine (the link layer signs, encrypts and frames it), takes
incoming messages through `deliver`, and publishes membership events on a memory channel.
The only clock read in membership is `trio.current_time()`, here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from hydra_node.mesh.membership import (
    Action, Announcement, LocalMembershipError, Membership, MembershipEvent, MembershipStatistics,
    Send,
)

__all__ = ["GossipService", "GossipServiceStatistics", "SendFn"]

log = logging.getLogger(__name__)

SendFn = Callable[[str, dict], Awaitable[None]]
DEFAULT_EVENT_BUFFER = 256  # membership events waiting for the node; more are dropped and counted
DEFAULT_MAX_SENDS = 128  # sends in flight at once; gossip tolerates loss, so more are dropped
DEFAULT_SEND_TIMEOUT = 1.0  # one slow link must not hold a send slot past a protocol period
SEND_ERRORS: tuple[type[BaseException], ...] = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


@dataclass(frozen=True)
class GossipServiceStatistics:
    membership: MembershipStatistics
    sends_in_flight: int
    dropped_sends: int
    failed_sends: int
    dropped_events: int


class GossipService:
    """Runs one node's membership. Start with `await nursery.start(service.run)`.

    `send(peer_id, wire)` may raise one of `send_errors` (the link is down): the core then
    probes that peer at once. Events arrive on `service.events` (closed when `run` ends).
    """

    def __init__(self, membership: Membership, send: SendFn, *,
                 event_buffer: int = DEFAULT_EVENT_BUFFER, max_sends: int = DEFAULT_MAX_SENDS,
                 send_timeout: float = DEFAULT_SEND_TIMEOUT,
                 send_errors: tuple[type[BaseException], ...] = SEND_ERRORS) -> None:
        self.membership = membership
        self._send = send
        self._send_timeout = send_timeout
        self._send_errors = send_errors
        self._max_sends = max_sends
        self._events_in, self.events = trio.open_memory_channel[MembershipEvent](event_buffer)
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()
        self.dropped_sends = 0
        self.failed_sends = 0
        self.dropped_events = 0

    @property
    def node_id(self) -> str:
        return self.membership.node_id

    async def run(self, *, task_status: trio.TaskStatus[GossipService] = trio.TASK_STATUS_IGNORED) -> None:
        """Drive the core until cancelled; `started()` hands back the service."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started(self)
                while True:
                    with trio.move_on_at(self.membership.next_deadline()):
                        await self._wake.wait()
                    self._wake = trio.Event()
                    self._handle(self.membership.tick(trio.current_time()), wake=False)
        finally:
            self._nursery = None
            self._events_in.close()

    # ------------------------------------------------------------ inputs
    async def deliver(self, sender_id: str, wire: Mapping[str, Any]) -> None:
        """An incoming message from an authenticated link (never raises for bad content)."""
        self._handle(self.membership.on_message(sender_id, wire, trio.current_time()))
        await trio.lowlevel.checkpoint()

    def join(self, seed_ids: Iterable[str]) -> None:
        self._handle(self.membership.join(seed_ids))

    def local_update(self, announcement: Announcement) -> None:
        self._handle(self.membership.local_update(announcement))

    def link_up(self, peer_id: str) -> None:
        self._handle(self.membership.link_up(peer_id, trio.current_time()))

    def link_down(self, peer_id: str) -> None:
        self._handle(self.membership.link_down(peer_id, trio.current_time()))

    async def leave(self) -> None:
        """Send Leave to every member and wait for those sends; bound it with a cancel scope."""
        self._handle(self.membership.leave())
        await self._idle.wait()

    def statistics(self) -> GossipServiceStatistics:
        return GossipServiceStatistics(
            membership=self.membership.statistics(trio.current_time()), sends_in_flight=self._in_flight,
            dropped_sends=self.dropped_sends, failed_sends=self.failed_sends,
            dropped_events=self.dropped_events)

    # ------------------------------------------------------------ plumbing
    def _handle(self, actions: list[Action], *, wake: bool = True) -> None:
        if self._nursery is None:
            raise LocalMembershipError("GossipService is not running; start it with nursery.start(service.run)")
        for action in actions:
            if isinstance(action, Send):
                if self._in_flight >= self._max_sends:
                    self.dropped_sends += 1
                    continue
                if self._in_flight == 0:
                    self._idle = trio.Event()
                self._in_flight += 1
                self._nursery.start_soon(self._send_one, action.to, action.message.to_wire())
            else:
                try:
                    self._events_in.send_nowait(action)
                except trio.WouldBlock:
                    self.dropped_events += 1
        if wake:  # an input may have moved next_deadline earlier
            self._wake.set()

    async def _send_one(self, peer_id: str, wire: dict) -> None:
        try:
            with trio.move_on_after(self._send_timeout) as scope:
                await self._send(peer_id, wire)
            failed = scope.cancelled_caught
        except self._send_errors as exc:
            log.debug("event=gossip_send_failed peer=%s error=%r", peer_id, exc)
            failed = True
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        if failed:
            self.failed_sends += 1
            if self._nursery is not None:
                self._handle(self.membership.link_down(peer_id, trio.current_time()))
