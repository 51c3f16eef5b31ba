"""The link table: one open link per peer, dialled on demand and shared by concurrent callers.

When both sides dial each other at once, each keeps the link initiated by the smaller node id, so
both keep the same one; a direct link is always kept over a relayed one (hole punching, relays.md).
Links run in the nursery the table is given (the service's session).

Dials obey :mod:`.dial_limits`: per-peer jittered back-off after failures, a budget for peers
never linked, a bound on dials in progress at once (a dial that waited for a slot is skipped if
the peer linked to us meanwhile), and a direction: the smaller id of a pair dials. New members are
linked ahead of need by the smaller id after a random delay (:meth:`LinkTable.member_joined`); the
larger id gives a never-linked peer a grace to dial in before dialling on demand itself.
"""

from __future__ import annotations

import logging
import random
from functools import partial
from typing import Any, Callable, Iterable

import trio

from hydra_node.mesh.dial_limits import DialLimiter, DialLimits, inbound_wait, predial_delay
from hydra_node.mesh.link.endpoints import connect_link
from hydra_node.mesh.wire.errors import LinkClosed, MeshError
from hydra_node.mesh.joining import DialCandidate
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink

__all__ = ["BACKGROUND_DIAL_TIMEOUT_S", "DIAL_TIMEOUT_S", "LinkTable"]

log = logging.getLogger("hydra.mesh")

#: How long a caller waits for a link to be dialled.
DIAL_TIMEOUT_S = 3.0
#: Bound on one background dial of a peer (all its addresses, handshake included).
BACKGROUND_DIAL_TIMEOUT_S = 10.0
#: A relayed link replaced by a direct one stays open this long at most for its streams to end.
RETIRE_TIMEOUT_S = 60.0
RETIRE_POLL_S = 0.25


class LinkTable:
    """``addresses_of(peer_id)`` gives the link URLs to dial a peer by id (from its announcement);
    ``on_up``/``on_down(peer_id)`` report a link adopted / lost with an error."""

    def __init__(
        self,
        node_id: str,
        nursery: trio.Nursery,
        settings: Callable[[], LinkSettings],
        *,
        addresses_of: Callable[[str], Iterable[str]],
        on_up: Callable[[str], None],
        on_down: Callable[[str], None],
        connect: Callable[..., Any] = connect_link,
        limits: DialLimits | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.node_id = node_id
        self._nursery = nursery
        self._settings = settings
        self._addresses_of = addresses_of
        self._on_up = on_up
        self._on_down = on_down
        self._connect = connect  # connect_link's signature; the relay agent's also dials relay: URLs
        self._links: dict[str, PeerLink] = {}
        self._dialing: dict[str, trio.Event] = {}
        self.duplicate_links_closed = 0
        self.dial_failures = 0
        self.dials = 0  # connection attempts (one per address tried)
        self.predials = 0  # members linked ahead of need (member_joined)
        self.dials_skipped = 0  # dials dropped after waiting for a slot: the peer had linked to us
        self.inbound_awaited = 0  # on-demand dials not needed: the smaller id linked to us in its grace
        self._adopted = trio.Event()  # set (and replaced) whenever a link is adopted
        #: dials of peers by their announced addresses are rate-limited (see mesh/dial_limits.py)
        self.dial_limiter = DialLimiter(limits or DialLimits())
        self._dial_slots = trio.Semaphore(self.dial_limiter.limits.max_concurrent)
        self._rng = rng or random.Random()

    def counters(self) -> dict[str, int]:
        """Dial counters for the status view's ``mesh.counters``."""
        return {
            "dials": self.dials,
            "predials": self.predials,
            "dials_skipped": self.dials_skipped,
            "inbound_awaited": self.inbound_awaited,
            "dials_in_progress": self.dial_limiter.limits.max_concurrent - self._dial_slots.value,
        }

    def get(self, peer_id: str) -> PeerLink | None:
        link = self._links.get(peer_id)
        return link if link is not None and not link.closed else None

    def open_links(self) -> list[PeerLink]:
        return [link for link in self._links.values() if not link.closed]

    def items(self) -> list[tuple[str, PeerLink]]:
        return list(self._links.items())

    def _initiator_of(self, link: PeerLink) -> str:
        return self.node_id if link.is_initiator else link.peer_id

    def adopt(self, link: PeerLink) -> None:
        """Keep one link per peer: a direct one over a relayed one, then the one initiated by the
        smaller node id (both sides agree)."""
        old = self._links.get(link.peer_id)
        if old is not None and old is not link and not old.closed:
            keep, drop = sorted((old, link), key=lambda k: (k.relay is not None, self._initiator_of(k)))
            self.duplicate_links_closed += 1
            if drop.relay is not None and keep.relay is None:  # moved to a direct path: let its streams end
                self._nursery.start_soon(self._retire, drop)
            else:
                self._nursery.start_soon(drop.aclose, "duplicate", "another link to this peer is kept")
            if drop is link:
                return
        self._links[link.peer_id] = link
        self.dial_limiter.linked(link.peer_id)
        self._adopted.set()
        self._adopted = trio.Event()
        self._nursery.start_soon(self._watch, link)
        self._on_up(link.peer_id)

    async def _retire(self, link: PeerLink) -> None:
        """Close a relayed link replaced by a direct one once the streams open on it have ended
        (new ones go to the direct link), within RETIRE_TIMEOUT_S."""
        with trio.move_on_after(RETIRE_TIMEOUT_S):
            while not link.closed and link.statistics().streams_open:
                await trio.sleep(RETIRE_POLL_S)
        await link.aclose("moved", "the link moved to a direct path")

    async def _watch(self, link: PeerLink) -> None:
        await link.wait_closed()
        if self._links.get(link.peer_id) is link:
            del self._links[link.peer_id]
            if link.close_error is not None:
                self._on_down(link.peer_id)

    async def dial(self, urls: Iterable[str], peer_id: str | None, timeout_s: float) -> PeerLink | None:
        """Dial ``urls`` in order (all within ``timeout_s``) and adopt the first link; None if none answered."""
        with trio.move_on_after(timeout_s):
            for url in urls:
                async with self._dial_slots:
                    if peer_id is not None and (linked := self.get(peer_id)) is not None:
                        self.dials_skipped += 1  # it linked to us while we waited for a slot
                        return linked
                    self.dials += 1
                    try:
                        link = await self._nursery.start(partial(self._run_dialled, url, peer_id))
                    except (MeshError, OSError) as exc:
                        log.debug("event=dial_failed url=%s error=%r", url, exc)
                        continue
                self.adopt(link)
                return self._links.get(link.peer_id, link)
        self.dial_failures += 1
        return None

    async def _run_dialled(
        self, url: str, peer_id: str | None, *, task_status: trio.TaskStatus[PeerLink] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run one dialled link. A failure before the link is up goes to the dialler; one after it
        (a transport that breaks with a mesh error) ends that link only, never the whole session."""
        status = _StartedFlag(task_status)
        try:
            await self._connect(url, self._settings(), expected_peer_id=peer_id, task_status=status)
        except (MeshError, OSError) as exc:
            if not status.done:
                raise
            log.warning("event=link_failed url=%s peer=%s error=%r", url, (peer_id or "?")[:16], exc)

    async def dial_candidates(
        self, candidates: Iterable[DialCandidate], timeout_s: float, *, skip: Iterable[str] = ()
    ) -> list[str]:
        """Link with each candidate (``timeout_s`` each) we have no link to; the peer ids now linked,
        in order, without those in ``skip``."""
        skip = set(skip)
        linked: list[str] = []
        for cand in candidates:
            if cand.peer_id is not None and (cand.peer_id in skip or self.get(cand.peer_id) is not None):
                if cand.peer_id not in skip and cand.peer_id not in linked:
                    linked.append(cand.peer_id)
                continue
            link = await self.dial(cand.urls, cand.peer_id, timeout_s)
            if link is not None and link.peer_id not in linked and link.peer_id not in skip:
                linked.append(link.peer_id)
        return linked

    def member_joined(self, peer_id: str) -> None:
        """A new member: link to it ahead of need if we are the side to dial (smaller id), after a
        random delay, so the first probe or gossip finds the link up and a mass join spreads its
        handshakes instead of firing them all at once."""
        delay = predial_delay(self.node_id, peer_id, self._rng.random(), self.dial_limiter.limits)
        if delay is not None and self.get(peer_id) is None and peer_id not in self._dialing:
            self._nursery.start_soon(self._predial, peer_id, delay)

    async def _predial(self, peer_id: str, delay: float) -> None:
        await trio.sleep(delay)
        if self.get(peer_id) is None and peer_id not in self._dialing:
            self.predials += 1
            done = self._dialing[peer_id] = trio.Event()
            await self._dial_peer(peer_id, done)

    async def link_to(self, peer_id: str) -> PeerLink:
        """The open link to ``peer_id``, dialling it (once, shared by concurrent callers) if needed."""
        link = self.get(peer_id)
        if link is not None:
            return link
        pending = self._dialing.get(peer_id)
        if pending is None:
            # Dial in the background: a handshake on a loaded machine can outlast the caller's
            # patience (gossip sends wait 1 s), and an abandoned dial would be wasted work.
            pending = self._dialing[peer_id] = trio.Event()
            self._nursery.start_soon(self._dial_peer, peer_id, pending)
        with trio.move_on_after(DIAL_TIMEOUT_S):
            await pending.wait()
        link = self.get(peer_id)
        if link is None:
            raise LinkClosed(f"no link to peer {peer_id[:16]}", code="unreachable")
        return link

    async def _await_inbound(self, peer_id: str) -> bool:
        """For a never-linked peer that is the side to dial: wait its grace for it to link to us."""
        if self.dial_limiter.was_linked(peer_id):
            return False
        wait = inbound_wait(self.node_id, peer_id, self._rng.random(), self.dial_limiter.limits)
        with trio.move_on_after(wait):
            while self.get(peer_id) is None:
                await self._adopted.wait()
            self.inbound_awaited += 1
            return True
        return False

    async def _dial_peer(self, peer_id: str, done: trio.Event) -> None:
        """Dial a peer at the addresses it announced, unless the dial limiter defers it (then the
        caller finds no link: the peer is unreachable for now) or the peer links to us first."""
        try:
            if await self._await_inbound(peer_id):
                return
            urls = list(self._addresses_of(peer_id))
            if urls and self.dial_limiter.allow(peer_id, trio.current_time()):
                if await self.dial(urls, peer_id, BACKGROUND_DIAL_TIMEOUT_S) is None:
                    self.dial_limiter.failed(peer_id, trio.current_time(), self._rng.random())
        finally:
            done.set()
            self._dialing.pop(peer_id, None)

    async def close_all(self, code: str, message: str) -> None:
        async with trio.open_nursery() as nursery:
            for link in list(self._links.values()):
                nursery.start_soon(link.aclose, code, message)


class _StartedFlag:
    """A task status that remembers whether ``started`` was called."""

    def __init__(self, inner: trio.TaskStatus[PeerLink]) -> None:
        self._inner = inner
        self.done = False

    def started(self, value: PeerLink) -> None:
        self.done = True
        self._inner.started(value)
