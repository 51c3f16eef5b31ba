"""`GossipService`: the thin trio driver around the sans-IO `Membership` core.

It sleeps until `next_deadline()`, feeds `tick`, hands each `Send` to an injected
`send(peer_id, wire_dict)` coroutine (the link layer signs, encrypts and frames it), takes
incoming messages through `deliver`, and publishes membership events on a memory channel.
The only clock read in membership is `trio.current_time()`, here.

On a loaded host the timer wakes late. The driver reports every wake's lateness to the core
(`Membership.note_local_lag`, Lifeguard's local health), and after a late wake it first lets
the messages that arrived meanwhile reach the core (a few scheduler passes) before it runs the
timers: otherwise an Ack already sitting in a socket buffer would count as a failed probe.
While the loop keeps running late it also sheds part of the dissemination traffic
(`gossip_load.GossipLoad`), so an overloaded mesh calms down instead of feeding on itself.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from hydra_node.mesh.gossip_load import GossipLoad
from hydra_node.mesh.membership import (
    Action,
    Announcement,
    LocalMembershipError,
    Membership,
    MembershipEvent,
    MembershipStatistics,
    Send,
)

__all__ = ["GossipService", "GossipServiceStatistics", "SendFn"]

log = logging.getLogger(__name__)

SendFn = Callable[[str, dict], Awaitable[None]]
DEFAULT_EVENT_BUFFER = 256  # membership events waiting for the node; more are dropped and counted
DEFAULT_MAX_SENDS = 128  # sends in flight at once; gossip tolerates loss, so more are dropped
DEFAULT_SEND_TIMEOUT = 1.0  # one slow link must not hold a send slot past a protocol period
#: A timer wake this late (s) lets pending input reach the core before the timers run.
SETTLE_AFTER_LAG_S = 0.02
#: Scheduler passes that carry a received frame to the core: the websocket's reader task, the
#: link's reader, its message dispatcher (then `deliver`), and one to spare.
SETTLE_CHECKPOINTS = 4
#: A wake this late (s) is counted as late in the statistics (the core applies its own threshold).
LATE_WAKE_S = 0.1
SEND_ERRORS: tuple[type[BaseException], ...] = (OSError, trio.BrokenResourceError, trio.ClosedResourceError)


@dataclass(frozen=True)
class GossipServiceStatistics:
    membership: MembershipStatistics
    sends_in_flight: int
    dropped_sends: int
    failed_sends: int
    dropped_events: int
    timed_out_sends: int = 0  # sends that ran past send_timeout (slow, not down: no link_down)
    shed_sends: int = 0  # Gossip messages not sent because our loop ran late (gossip_load.py)
    late_wakes: int = 0  # timer wakes at least LATE_WAKE_S late
    max_lag_s: float = 0.0  # the latest timer wake so far, in seconds


class GossipService:
    """Runs one node's membership. Start with `await nursery.start(service.run)`.

    `send(peer_id, wire)` may raise one of `send_errors` (the link is down): the core then
    probes that peer at once. Events arrive on `service.events` (closed when `run` ends).
    """

    def __init__(
        self,
        membership: Membership,
        send: SendFn,
        *,
        event_buffer: int = DEFAULT_EVENT_BUFFER,
        max_sends: int = DEFAULT_MAX_SENDS,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        send_errors: tuple[type[BaseException], ...] = SEND_ERRORS,
        load: GossipLoad | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.membership = membership
        self.load = load or GossipLoad()
        self._rng = rng or random.Random()
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
        self.timed_out_sends = 0
        self.dropped_events = 0
        self.late_wakes = 0
        self.max_lag_s = 0.0

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
                    deadline = self.membership.next_deadline()
                    with trio.move_on_at(deadline) as timer:
                        await self._wake.wait()
                    self._wake = trio.Event()
                    if timer.cancelled_caught:
                        await self._timer_woke(trio.current_time() - deadline)
                    self._handle(self.membership.tick(trio.current_time()), wake=False)
        finally:
            self._nursery = None
            self._events_in.close()

    async def _timer_woke(self, lag_s: float) -> None:
        """Report how late the timer woke; after a late wake, let pending input in first."""
        lag_s = max(0.0, lag_s)
        self.membership.note_local_lag(lag_s, trio.current_time())
        self.load.note_wake(lag_s)
        self.max_lag_s = max(self.max_lag_s, lag_s)
        if lag_s >= LATE_WAKE_S:
            self.late_wakes += 1
        if lag_s >= SETTLE_AFTER_LAG_S:
            for _ in range(SETTLE_CHECKPOINTS):
                await trio.lowlevel.checkpoint()

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
            membership=self.membership.statistics(trio.current_time()),
            sends_in_flight=self._in_flight,
            dropped_sends=self.dropped_sends,
            failed_sends=self.failed_sends,
            dropped_events=self.dropped_events,
            timed_out_sends=self.timed_out_sends,
            late_wakes=self.late_wakes,
            max_lag_s=self.max_lag_s,
            shed_sends=self.load.shed_count,
        )

    def lag_counters(self) -> dict[str, int]:
        """Event-loop lag and slow sends for the status view's ``mesh.counters`` (integers)."""
        return {
            "loop_lag_max_ms": round(self.max_lag_s * 1000),
            "loop_lag_late_wakes": self.late_wakes,
            "gossip_timed_out_sends": self.timed_out_sends,
            "gossip_shed_sends": self.load.shed_count,
            "loop_lag_avg_ms": round(self.load.lag_avg_s * 1000),
        }

    # ------------------------------------------------------------ plumbing
    def _handle(self, actions: list[Action], *, wake: bool = True) -> None:
        if self._nursery is None:
            raise LocalMembershipError("GossipService is not running; start it with nursery.start(service.run)")
        for action in actions:
            if isinstance(action, Send):
                if self._in_flight >= self._max_sends:
                    self.dropped_sends += 1
                    continue
                if self.load.shed(action.message.TYPE, self._rng.random()):
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
        """Send one message. Only an error (the link broke, the peer refused) is reported to the
        core as ``link_down``; a send that is merely slow (a handshake on a loaded host) is
        dropped and counted: gossip tolerates loss, and an extra probe would only add load."""
        failed = False
        try:
            with trio.move_on_after(self._send_timeout) as scope:
                await self._send(peer_id, wire)
            if scope.cancelled_caught:
                self.timed_out_sends += 1
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
