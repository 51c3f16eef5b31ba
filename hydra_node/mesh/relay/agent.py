"""`RelayAgent`: the mesh service's relaying, as one trio driver.

It learns our reachability (asks linked peers to dial us back), relays for others when it should
(``server.RelayServer``), and when we cannot be dialled holds reservations at up to
``selection.MAX_RELAYS`` relays — replacing one that fails — and announces them. It dials
``relay:<id>`` addresses for the link table (``connect``) and accepts relayed links, adopting them
like any inbound link, and hands relayed links to ``upgrade.LinkUpgrader``, which moves them to a
direct path when it can (hole punching). Everything it needs comes in as callables (``RelayInputs``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping

import trio

from hydra_node.mesh.announcer import AnnouncementContent
from hydra_node.mesh.link.dialback import dial_back
from hydra_node.mesh.link.dialback_policy import DialbackLimiter, DialbackTarget, dialback_targets
from hydra_node.mesh.link.endpoints import connect_link
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink
from hydra_node.mesh.link.stream import LinkStream
from hydra_node.mesh.relay.client import accept_relayed, connect_via_relay, hold_reservation
from hydra_node.mesh.relay.messages import (
    DIALBACK_KIND,
    NONCE_BYTES,
    RELAY_VERSION,
    RelayProtocolError,
    encode_reply,
    parse_dialback,
    parse_incoming,
)
from hydra_node.mesh.relay.reachability import Reachability, ReachabilityView
from hydra_node.mesh.relay.selection import announce_extra, choose_relays, parse_relay_url
from hydra_node.mesh.relay.server import RelayServer, RelayServerStatistics, read_reply
from hydra_node.mesh.relay.settings import RelaySettings
from hydra_node.mesh.relay.upgrade import LinkUpgrader, UpgradeInputs
from hydra_node.mesh.wire.errors import LinkClosed, MeshError

__all__ = ["RelayAgent", "RelayInputs", "RelayStatus"]

log = logging.getLogger("hydra.mesh.relay")

TICK_S = 1.0
"""How often the agent re-checks what it should do (reachability due, relays to reserve)."""
CHECKERS = 3
"""Peers asked per reachability check."""
DIALBACK_TIMEOUT_S = 3.0
"""Bound on dialling one address back."""
MAX_CONCURRENT_DIALBACKS = 4
"""Dial-back requests this node serves at once; more are refused (busy)."""
RELAY_RETRY_S = 10.0
"""A relay that refused or failed is not chosen again for this long."""
REJECTION_CODES = ("tamper", "reorder", "bad_frame", "oversize", "replay")


@dataclass(frozen=True)
class RelayInputs:
    """What the agent uses of the mesh service (all callables; none holds the service)."""

    node_id: str
    role: str
    link_settings: Callable[[], LinkSettings]
    link_to: Callable[[str], Any]  # async (peer id) -> PeerLink
    open_links: Callable[[], list[PeerLink]]
    members: Callable[[], Mapping[str, Any]]  # peer id -> Announcement
    alive: Callable[[str], bool]
    addresses: Callable[[], list[str]]
    adopt: Callable[[PeerLink], None]
    link: Callable[[str], PeerLink | None] = lambda _: None  # the link table's link to a peer (no dial)


@dataclass(frozen=True)
class RelayStatus:
    """``/api/status`` ``mesh.relays``: what we relay, where we are reserved, relayed links."""

    mode: str
    offering: bool
    reserved_at: tuple[str, ...]
    relayed_links: int
    server: RelayServerStatistics | None
    counters: Mapping[str, int]
    hole_punch: bool = True
    """Relayed links are moved to a direct path when possible (``[relay] hole_punch``)."""
    punched_links: int = 0


class RelayAgent:
    def __init__(
        self, settings: RelaySettings, inputs: RelayInputs, *, tamper: Callable[[bytes], bytes] | None = None
    ) -> None:
        self.settings = settings
        self._in = inputs
        self.reachability = Reachability()
        self.server = RelayServer(settings.limits, tamper=tamper) if settings.mode != "off" else None
        self._held: dict[str, trio.CancelScope] = {}  # relay id -> its reservation task's scope
        self._reserved: set[str] = set()  # relays that confirmed our reservation
        self._failed: dict[str, float] = {}  # relay id -> not before
        self._dialbacks = 0
        self._dialback_limiter = DialbackLimiter()
        self.counters: Counter[str] = Counter()
        self._rng = random.Random()
        #: Moves relayed links to a direct path: a direct dial or hole punching (upgrade.py).
        self.upgrader = LinkUpgrader(
            settings.hole_punch,
            UpgradeInputs(
                link_settings=inputs.link_settings, members=inputs.members, current=inputs.link, adopt=inputs.adopt
            ),
            self.counters,
            rng=self._rng,
        )

    # ---- what others read -----------------------------------------------------------------------
    def _peers_available(self) -> int:
        """Peers we could ask to dial us back: those linked not through a relay (the checkers)."""
        return min(CHECKERS, sum(1 for link in self._in.open_links() if link.relay is None))

    def _dialled_directly(self) -> bool:
        """A peer dialled us directly (a link we accepted, not a relayed one): we can be dialled. This
        needs no dial-back, and a loaded host's slow dial-backs cannot outvote it. A punched link proves
        nothing: both ends dialled it."""
        return any(
            not link.is_initiator and link.path == "direct" and not link.closed for link in self._in.open_links()
        )

    def reachable(self) -> bool | str:
        if self._dialled_directly():
            return True
        return self.reachability.verdict(trio.current_time(), self._peers_available())

    @property
    def offering(self) -> bool:
        reach = self.reachable()
        if self.server is None or reach is False:
            return False
        return self.settings.mode == "on" or (reach is True and self._in.role != "client")

    def extend(self, content: AnnouncementContent) -> AnnouncementContent:
        """The root's announcement content plus our ``reach``/``relay``/``relays`` entries."""
        extra = announce_extra(
            reach=self.reachable(),
            offering=self.offering,
            bytes_per_s=self.settings.limits.bytes_per_s,
            relays=self._reserved,
        )
        return dataclasses.replace(content, extra={**content.extra, **extra})

    def reachability_view(self) -> ReachabilityView:
        view = self.reachability.view(trio.current_time(), self._peers_available())
        return dataclasses.replace(view, reachable=True, method="inbound_link") if self._dialled_directly() else view

    def status(self) -> RelayStatus:
        return RelayStatus(
            mode=self.settings.mode,
            offering=self.offering,
            reserved_at=tuple(sorted(self._reserved)),
            relayed_links=sum(1 for link in self._in.open_links() if link.relay is not None),
            server=self.server.statistics() if self.server is not None else None,
            counters=dict(self.counters),
            hole_punch=self.upgrader.enabled,
            punched_links=sum(1 for link in self._in.open_links() if link.path == "punched"),
        )

    # ---- stream handlers (declared by the mesh service) ------------------------------------------
    async def on_reserve(self, link: PeerLink, header: dict, stream: LinkStream) -> None:
        if not self.offering:
            await stream.send(encode_reply("refused", code="not_a_relay", message="this node does not relay now"))
            return
        await self.server.serve_reserve(link, header, stream)  # type: ignore[union-attr]

    async def on_connect(self, link: PeerLink, header: dict, stream: LinkStream) -> None:
        if self.server is None:
            await stream.send(encode_reply("refused", code="not_a_relay", message="this node does not relay"))
            return
        await self.server.serve_connect(link, header, stream)

    async def on_incoming(self, link: PeerLink, header: dict, stream: LinkStream) -> None:
        inner = await accept_relayed(
            link, header, stream, self._in.link_settings(), allowed=link.peer_id in self._reserved
        )
        if inner is None:
            self.counters["relayed_accept_failed"] += 1
            return
        self.counters["relayed_links_accepted"] += 1
        incoming = parse_incoming(header)
        await self._run_adopted(inner, incoming.observed, incoming.peer_observed)

    async def _run_adopted(self, inner: PeerLink, observed: str | None, peer_observed: str | None = None) -> None:
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(inner.run)
                self._in.adopt(inner)
                # we accepted it: we try a direct path
                self.upgrader.relayed_link_up(inner, observed, drive=True, peer_observed=peer_observed)
                await inner.wait_closed()
        finally:
            self.upgrader.relayed_link_down(inner)
        self._count_close(inner)

    async def on_punch(self, link: PeerLink, header: dict, stream: LinkStream) -> None:
        await self.upgrader.on_punch(link, header, stream)

    def _count_close(self, link: PeerLink) -> None:
        code = link.close_error.code if link.close_error is not None else None
        if code in REJECTION_CODES:
            self.counters[f"relayed_rejected_{code}"] += 1

    async def on_dialback(self, link: PeerLink, header: dict, stream: LinkStream) -> None:
        """Dial the requester back, only at its observed address and announced ports (dialback_policy.py)."""
        try:
            request = parse_dialback(header)
        except RelayProtocolError as exc:
            await stream.send(encode_reply("refused", code=exc.code, message=str(exc)))
            return
        observed = link.remote_host if link.relay is None else None
        ann = self._in.members().get(link.peer_id)
        targets = dialback_targets(request.addrs, observed, ann.addresses) if observed and ann is not None else {}
        wanted = {t for t in targets.values() if t is not None}
        refusal = self._dialback_refusal(link.peer_id, observed, ann is not None, len(wanted))
        if refusal is not None:
            self.counters[f"dialbacks_refused_{refusal[0]}"] += 1
            await stream.send(encode_reply("refused", code=refusal[0], message=refusal[1]))
            return
        self.counters["dialback_addresses_not_dialled"] += sum(1 for t in targets.values() if t is None)
        self._dialbacks += 1
        reached: dict[DialbackTarget, bool] = {}
        try:

            async def one(target: DialbackTarget) -> None:
                reached[target] = await dial_back(target.url, link.peer_id, request.nonce, DIALBACK_TIMEOUT_S)

            async with trio.open_nursery() as nursery:
                for target in wanted:
                    nursery.start_soon(one, target)
        finally:
            self._dialbacks -= 1
        self.counters["dialbacks_served"] += 1
        results = {addr: t is not None and reached.get(t, False) for addr, t in targets.items()}
        await stream.send(encode_reply("dialback", results=results))

    def _dialback_refusal(self, peer: str, observed: str | None, announced: bool, dials: int) -> tuple[str, str] | None:
        """Why a dial-back request is refused (code, message), or None: it may cost ``dials`` dials."""
        if observed is None:
            return "no_observed_address", "ask on a direct link: we dial back only the address the link comes from"
        if not announced:
            return "unknown_peer", "no announcement of yours has reached us yet (we dial only announced ports)"
        if self._dialbacks >= MAX_CONCURRENT_DIALBACKS:
            return "busy", "too many dial-backs in progress"
        if not self._dialback_limiter.allow(peer, dials, trio.current_time()):
            log.info("event=dialback_rate_limited peer=%s dials=%d", peer[:16], dials)
            return "rate_limited", "too many dial-backs asked; ask again later"
        return None

    # ---- dialling (the link table's connect) ------------------------------------------------------
    async def connect(
        self,
        url: str,
        settings: LinkSettings,
        *,
        expected_peer_id: str | None = None,
        invite=None,
        task_status: trio.TaskStatus[PeerLink] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """``connect_link`` for ``ws://`` URLs; through the relay for ``relay:<id>`` ones."""
        relay = parse_relay_url(url)
        if relay is None:
            await connect_link(url, settings, invite=invite, expected_peer_id=expected_peer_id, task_status=task_status)
            return
        if expected_peer_id is None or invite is not None:
            raise LinkClosed("a relay address is dialled by peer id, by a mesh member", code="connect_failed")
        relay_link = await self._in.link_to(relay)
        observed: list[str | None] = []
        peer_observed: list[str | None] = []
        inner = None
        try:
            async with trio.open_nursery() as nursery:
                inner = await nursery.start(
                    partial(
                        connect_via_relay,
                        relay_link,
                        expected_peer_id,
                        settings,
                        on_observed=observed.append,
                        on_peer_observed=peer_observed.append,
                    )
                )
                self.counters["relayed_links_dialled"] += 1
                self.upgrader.relayed_link_up(
                    inner,
                    observed[0] if observed else None,
                    drive=False,
                    peer_observed=peer_observed[0] if peer_observed else None,
                )
                task_status.started(inner)
                await inner.wait_closed()
        finally:
            if inner is not None:
                self.upgrader.relayed_link_down(inner)
        self._count_close(inner)

    # ---- the driver --------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[RelayAgent] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.upgrader.run)
            task_status.started(self)
            while True:
                now = trio.current_time()
                self.reachability.set_addresses(tuple(self._in.addresses()))
                links = [link for link in self._in.open_links() if link.relay is None and not link.closed]
                if links and now >= self.reachability.next_check(now, self._peers_available()):
                    self.reachability.checked(now)
                    for link in self._rng.sample(links, min(CHECKERS, len(links))):
                        nursery.start_soon(self._ask_dialback, link)
                self._keep_reservations(nursery, now)
                await trio.sleep(TICK_S)

    async def _ask_dialback(self, link: PeerLink) -> None:
        addrs = list(self._in.addresses())[:8]
        if not addrs:
            return
        header = {"kind": DIALBACK_KIND, "v": RELAY_VERSION, "addrs": addrs, "nonce": os.urandom(NONCE_BYTES)}
        try:
            with trio.fail_after(DIALBACK_TIMEOUT_S * 2 + 2):
                async with link.open_stream(header) as stream:
                    await stream.send_eof()  # the request is all in the header
                    reply, _ = await read_reply(stream, "dialback")
        except (trio.TooSlowError, MeshError) as exc:
            self.counters["dialback_requests_failed"] += 1
            log.info("event=dialback_request_failed peer=%s error=%r", link.peer_id[:16], exc)
            return
        if reply["op"] == "dialback":
            before = self.reachable()
            self.reachability.report(link.peer_id, reply["results"], trio.current_time())
            after = self.reachable()
            if after != before:
                log.info("event=reachability reachable=%s checker=%s", after, link.peer_id[:16])

    def _keep_reservations(self, nursery: trio.Nursery, now: float) -> None:
        if self.reachable() is not False or not self.settings.use_relays:
            for scope in self._held.values():  # dialable (again): relays are not needed
                scope.cancel()
            return
        offers = {pid: ann.extra for pid, ann in self._in.members().items() if ann is not None}
        for relay in choose_relays(offers, self._in.alive, self._held, self._failed, now):
            scope = self._held[relay] = trio.CancelScope()
            nursery.start_soon(self._reservation, relay, scope)

    async def _reservation(self, relay: str, scope: trio.CancelScope) -> None:
        try:
            with scope:
                link = await self._in.link_to(relay)
                async with trio.open_nursery() as nursery:
                    await nursery.start(hold_reservation, link)
                    self._reserved.add(relay)
                    self.counters["reservations_made"] += 1
                    log.info("event=relay_reservation relay=%s", relay[:16])
                if link.closed:  # the relay went away: prefer another one for a while
                    self._failed[relay] = trio.current_time() + RELAY_RETRY_S
                    self.counters["reservations_lost"] += 1
        except (MeshError, OSError) as exc:
            self._failed[relay] = trio.current_time() + RELAY_RETRY_S
            self.counters["reservations_failed"] += 1
            log.info("event=relay_reservation_failed relay=%s error=%r", relay[:16], exc)
        finally:
            self._reserved.discard(relay)
            self._held.pop(relay, None)
