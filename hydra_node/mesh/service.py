"""MeshService: the node's part in the mesh — links, gossip and joining.

It holds one link per peer (:mod:`.links`), drives the membership core (:mod:`.gossip`), keeps our
announcement current (:mod:`.announcer`, content supplied by the root), remembers peers
(:mod:`.peerstore`) and enters a mesh through :meth:`MeshService.join` (:mod:`.joining`). Streams a
peer opens are served by handlers the root declares (:meth:`handle_stream`, :meth:`handle_tunnel`);
the mesh itself knows nothing of models or runners.

Life: ``await nursery.start(mesh.run, plan)`` — with a plan it reports ready once in the mesh;
without one it reports ready at once and a later ``await mesh.join(plan)`` (discovery) enters one.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path

import nacl.signing
import trio

from hydra_node import __version__
from hydra_node.mesh.link.addresses import advertised_addresses
from hydra_node.mesh.membership.signing import sign_announcement, verify_announcement
from hydra_node.mesh.announcer import ANNOUNCE_CHECK_S, AnnouncementContent, AnnouncementSource, Announcer
from hydra_node.eventlog import EmitFn
from hydra_node.listen import ListenPurpose, bind_tcp, close_listeners
from hydra_node.mesh.event_feed import MembershipFeed
from hydra_node.mesh.admission import admit_with_invite
from hydra_node.mesh.link.endpoints import LinkListener
from hydra_node.mesh.wire.errors import LinkClosed, MeshError
from hydra_node.mesh.gossip import GossipService, GossipServiceStatistics
from hydra_node.mesh.invite_relay import REVOCATIONS_MESSAGE, InviteService
from hydra_node.mesh.invites import InviteBook
from hydra_node.mesh.wire.ids import MeshSecret, node_id_from_public_key
from hydra_node.mesh.joining import DialCandidate, JoinFailed, JoinPlan, plan_join
from hydra_node.mesh.keyfile import load_mesh_key, save_mesh_key
from hydra_node.mesh.link.peer_link import LinkSettings, PeerLink
from hydra_node.mesh.link_table import DIAL_TIMEOUT_S, LinkTable
from hydra_node.mesh.membership import Announcement, Membership, PeerJoined, PeerUpdated
from hydra_node.mesh.peerstore import PeerStore
from hydra_node.mesh.relay.agent import RelayAgent, RelayInputs
from hydra_node.mesh.relay.messages import CONNECT_KIND, DIALBACK_KIND, INCOMING_KIND, RESERVE_KIND
from hydra_node.mesh.relay.punch import PUNCH_KIND
from hydra_node.mesh.relay.selection import dial_urls
from hydra_node.mesh.settings import MeshSettings
from hydra_node.mesh.verified import VerifiedAnnouncements
from hydra_node.mesh.status_view import MeshStatus, PeerRow, mesh_section, peer_rows
from hydra_node.mesh.link.stream import LinkStream
from hydra_node.mesh.stream_routes import StreamHandler, StreamRoutes
from hydra_node.mesh.wire.token import InviteToken, addr_to_url

__all__ = [
    "AnnouncementContent",
    "DIAL_TIMEOUT_S",
    "DialCandidate",
    "JoinFailed",
    "JoinPlan",
    "MeshService",
    "MeshSettings",
    "StreamHandler",
]

log = logging.getLogger("hydra.mesh")

#: Bound on the Leave broadcast at shutdown.
LEAVE_TIMEOUT_S = 2.0
#: A fresh /api/status token is issued when the current one has less than this left.
TOKEN_REFRESH_MARGIN_S = 3600.0
#: The link listener, as a port-in-use error names it.
LINK_PORT = ListenPurpose("the mesh's peer links", "--mesh-port")


class MeshService:
    """Our node in the mesh. ``state_dir`` is ``HOME/mesh`` (mesh.key, peers.json)."""

    def __init__(
        self,
        *,
        signing_key: nacl.signing.SigningKey,
        state_dir: Path,
        settings: MeshSettings,
        announcement: AnnouncementSource,
        name: str,
        version: str = __version__,
        on_event: EmitFn | None = None,
    ) -> None:
        self._settings = settings
        self._signing_key = signing_key
        self.node_id = node_id_from_public_key(bytes(signing_key.verify_key))
        self._key_path = state_dir / "mesh.key"
        self._peer_store = PeerStore(state_dir / "peers.json")
        #: Reachability, relaying for others and through others (mesh/relay/, docs/relays.md).
        self.relays = RelayAgent(
            settings.relay,
            RelayInputs(
                node_id=self.node_id,
                role=settings.role,
                link_settings=self._link_settings,
                link_to=self.link_to,
                open_links=self.open_links,
                members=self.members,
                alive=lambda p: self.member_states(0).get(p) == "alive",
                addresses=lambda: self._addresses,
                adopt=lambda link: self._links.adopt(link) if self._links else None,
                link=self.link,
            ),
        )
        self._announcer = Announcer(
            self.node_id,
            role=settings.role,
            name=name,
            version=version,
            source=lambda: self.relays.extend(announcement()),
        )
        self._secret: MeshSecret | None = None
        self._port: int | None = None  # the link listener's, once in a mesh
        self._addresses: list[str] = []  # what we advertise (invites, announcements)
        self._links: LinkTable | None = None
        self._gossip: GossipService | None = None
        self._membership: Membership | None = None
        self._listener: LinkListener | None = None
        self._bound: list[trio.SocketListener] | None = None  # bind(): the link port, served once in a mesh
        self._nursery: trio.Nursery | None = None
        self._join_lock = trio.Lock()
        self._left = False  # leave() was called: shutting down
        self._session_nursery: trio.Nursery | None = None
        self._token: tuple[str, float, str | None] | None = None  # (text, expires at, mesh id)
        self._incarnation = int(time.time())  # higher than any incarnation of an earlier run
        self._counters = {
            "bad_stream_headers": 0,
            "unknown_messages": 0,
            "quarantined_streams": 0,
            "announce_errors": 0,
        }
        self._routes = StreamRoutes()
        for kind, serve in (
            (RESERVE_KIND, self.relays.on_reserve),
            (CONNECT_KIND, self.relays.on_connect),
            (INCOMING_KIND, self.relays.on_incoming),
            (DIALBACK_KIND, self.relays.on_dialback),
            (PUNCH_KIND, self.relays.on_punch),
        ):
            self._routes.add_kind(kind, serve)
        #: Issued invites (HOME/mesh/invites.json), admission checks, revocation lists (mesh/invite_relay.py).
        self.invites = InviteService(InviteBook(state_dir / "invites.json", signing_key), self.node_id)
        self._on_event, self._feed = on_event, MembershipFeed()  # membership → live events (event_feed.py)

    # ---- read-only views (what consumers outside mesh/ may use) --------------------------
    @property
    def mesh_id(self) -> str | None:
        """Our mesh's id, None until we are in a mesh."""
        return self._secret.mesh_id if self._secret is not None else None

    @property
    def joined(self) -> bool:
        return self._secret is not None

    @property
    def mesh_secret(self) -> MeshSecret | None:
        """The mesh key (for discovery's LAN fingerprint); None until in a mesh."""
        return self._secret

    @property
    def port(self) -> int | None:
        """The link listener's port, None until in a mesh."""
        return self._port

    @property
    def addresses(self) -> list[str]:
        """The link addresses we advertise (in invites and our announcement)."""
        return list(self._addresses)

    @property
    def listen_host(self) -> str:
        return self._settings.listen_host

    @property
    def invite_ttl_s(self) -> float:
        return self._settings.invite_ttl_s

    def members(self) -> dict[str, Announcement]:
        """Members (alive or suspect, not us) with a verified announcement."""
        if self._membership is None:
            return {}
        return {pid: ann for pid, ann in self._membership.members().items() if ann is not None}

    def member_states(self, now: float) -> dict[str, str]:
        """peer id → membership state ("alive", "suspect", "dead", "left") of every peer we know."""
        if self._membership is None:
            return {}
        return self._membership.peer_states()  # not statistics(): routing asks on every request

    def link(self, peer_id: str) -> PeerLink | None:
        """The open link to ``peer_id``, or None (never dials; see :meth:`link_to`)."""
        return self._links.get(peer_id) if self._links is not None else None

    def open_links(self) -> list[PeerLink]:
        return self._links.open_links() if self._links is not None else []

    async def link_to(self, peer_id: str) -> PeerLink:
        """The open link to ``peer_id``, dialling it (once, shared by concurrent callers) if needed."""
        if self._links is None:
            raise LinkClosed("this node is not in a mesh", code="unreachable")
        return await self._links.link_to(peer_id)

    def gossip_statistics(self) -> GossipServiceStatistics | None:
        """The gossip driver's statistics, None before we are in a mesh."""
        return self._gossip.statistics() if self._gossip is not None else None

    # ---- declared by the root ------------------------------------------------------------
    def handle_stream(self, kind: str, handler: StreamHandler) -> None:
        """Serve streams whose header has ``kind`` (e.g. "generate") with ``handler``."""
        self._routes.add_kind(kind, handler)

    def handle_tunnel(self, name: str, handler: StreamHandler) -> None:
        """Serve ``tunnel`` streams whose header names ``service == name`` with ``handler``."""
        self._routes.add_tunnel(name, handler)

    # ---- lifecycle -------------------------------------------------------------------------
    async def bind(self) -> int:
        """Bind the link listener's port now, before any join (it is served once in a mesh), so a port in
        use fails the node's start at once (:class:`~hydra_node.listen.PortInUse`).  Returns the port."""
        self._bound = await bind_tcp(self._settings.listen_host, self._settings.listen_port, LINK_PORT)
        return self._bound[0].socket.getsockname()[1]

    async def run(
        self, plan: JoinPlan | None = None, *, task_status: trio.TaskStatus[MeshService] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until cancelled; with ``plan``, ready once it got us into the mesh (JoinFailed if not)."""
        if (fault := self._settings.fault) is not None:  # [testing] (docs/config.md): never in production
            log.warning("event=link_fault_injection %s: link fault injection is on (testing only)", fault.describe())
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if plan is not None:
                    await self.join(plan)
                task_status.started(self)
                await trio.sleep_forever()
        finally:
            self.close_unserved()

    def close_unserved(self) -> None:
        """Close the port :meth:`bind` bound if no mesh session served it (we never got into a mesh)."""
        close_listeners(self._bound)
        self._bound = None

    async def join(self, plan: JoinPlan) -> tuple[str, ...]:
        """Enter a mesh (or link further into ours) as ``plan`` says; returns the peers we seeded
        gossip with. JoinFailed when the plan's invites got us nowhere; a failed first entry leaves
        the service out of any mesh, so another plan can be tried."""
        if self._nursery is None:
            raise MeshError("the mesh service is not running; start it with nursery.start(mesh.run)")
        async with self._join_lock:
            held = self._secret if self._secret is not None else load_mesh_key(self._key_path)
            steps = plan_join(plan, current_mesh_id=self.mesh_id, held_mesh_id=held.mesh_id if held else None)
            if steps.conflict is not None:
                raise JoinFailed(steps.conflict)
            unreachable = JoinFailed(
                f"could not reach any address of the invite "
                f"({', '.join(plan.invites[0].addrs) if plan.invites else '-'})"
            )
            if self._secret is not None:
                assert self._links is not None  # in a mesh: the session's table is set with the secret
                seeds = await self._links.dial_candidates(steps.dials, DIAL_TIMEOUT_S)
                if steps.must_reach and not seeds:
                    raise unreachable
            else:
                session: trio.CancelScope = await self._nursery.start(self._session)
                try:
                    seeds = await self._enter(steps.admit_with, held, steps.dials, plan)
                    if steps.must_reach and not seeds:
                        raise unreachable
                except BaseException:
                    session.cancel()
                    self._leave_session()
                    raise
            if seeds and not self._left:
                assert self._gossip is not None  # in a mesh (seeds came from its links)
                self._gossip.join(seeds)
            return tuple(seeds)

    async def leave(self) -> None:
        """Tell peers we are leaving (bounded) so they drop us at once instead of probing. After it, our
        announcement is frozen and nobody is seeded: the membership core refuses both once left."""
        if self._gossip is None or self._left:
            return
        self._left = True
        with trio.move_on_after(LEAVE_TIMEOUT_S):
            await self._gossip.leave()
            # Close links gracefully: this flushes the queued Leave before the sockets go away,
            # so peers see "left" at once instead of suspecting a crash.
            assert self._links is not None  # set with the gossip service (one session)
            await self._links.close_all("leaving", "node shutting down")

    # ---- entering a mesh ---------------------------------------------------------------------
    async def _session(self, *, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
        """The tasks of one stay in a mesh (listener, gossip, links), cancelled together."""
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as session:
                self._session_nursery = session
                task_status.started(scope)
                await trio.sleep_forever()

    def _leave_session(self) -> None:
        self._session_nursery = None
        self._secret = self._gossip = self._membership = self._listener = self._links = None
        self._port, self._addresses = None, []
        self.invites.leave()

    async def _enter(
        self, admit_with: InviteToken | None, held: MeshSecret | None, dials: tuple[DialCandidate, ...], plan: JoinPlan
    ) -> list[str]:
        session = self._session_nursery
        assert session is not None  # set by _session, which join() started just before
        timeout_s = plan.admission_timeout_s if plan.admission_timeout_s is not None else self._settings.join_timeout_s
        first_link = None
        if admit_with is not None:
            first_link = await admit_with_invite(session, admit_with, self._link_settings(mesh=None), timeout_s)
            secret = first_link.mesh
            save_mesh_key(self._key_path, secret)
            log.info("event=mesh_joined mesh_id=%s via=%s", secret.mesh_id, first_link.peer_id[:16])
        elif held is not None:
            secret = held
        else:
            secret = MeshSecret.generate()
            save_mesh_key(self._key_path, secret)
            log.info("event=mesh_created mesh_id=%s", secret.mesh_id)
        self._secret = secret
        self.invites.enter(secret.mesh_id, session, self.open_links, self._trusted_issuer)
        self._links = LinkTable(
            self.node_id,
            session,
            self._link_settings,
            addresses_of=self._addresses_of,
            on_up=self._link_up,
            on_down=self._link_down,
            connect=self.relays.connect,
        )
        self._listener = LinkListener(self._link_settings(), on_link=self._on_inbound_link)
        # The port bind() bound, else (a later session: the first one's ended with it) bound here.
        listeners, self._bound = self._bound, None
        if listeners is None:
            listeners = await bind_tcp(self._settings.listen_host, self._settings.listen_port, LINK_PORT)
        self._port = await session.start(partial(self._listener.serve, self._settings.listen_host, listeners=listeners))
        self._addresses = advertised_addresses(self._settings.listen_host, self._port, self._settings.advertise)
        self._membership = Membership(
            self._announcement(),
            self._settings.membership,
            now=trio.current_time(),
            verify=VerifiedAnnouncements(verify_announcement),
            sign=partial(sign_announcement, self._signing_key),
        )
        self._gossip = await session.start(
            GossipService(
                self._membership,
                self._send,
                send_errors=(MeshError, OSError, trio.BrokenResourceError, trio.ClosedResourceError),
            ).run
        )
        await session.start(self.relays.run)
        session.start_soon(self._consume_events)
        session.start_soon(self._announce_loop)
        seeds: list[str] = []
        links = self._links
        if first_link is not None:
            links.adopt(first_link)
            seeds.append(first_link.peer_id)
        # Invites for the mesh whose key we already hold need no admission: dialling their issuers
        # is then what gets us in, with the admission's patience. Members are dialled briefly.
        patient = bool(plan.invites) and first_link is None
        seeds += await links.dial_candidates(dials, timeout_s if patient else DIAL_TIMEOUT_S, skip=seeds)
        if not plan.invites:
            session.start_soon(self._rejoin_known_peers)
        log.info(
            "event=mesh_ready mesh_id=%s port=%d addresses=%s", secret.mesh_id, self._port, ",".join(self._addresses)
        )
        return seeds

    async def _rejoin_known_peers(self) -> None:
        """Without an invite: dial the members we knew before a restart (best effort, in the background)."""
        # started by _enter in the session: its mesh, links and gossip are set
        mesh_id, links, gossip = self.mesh_id, self._links, self._gossip
        assert mesh_id is not None and links is not None and gossip is not None
        candidates = self._peer_store.candidates(mesh_id)
        seeds = await links.dial_candidates(candidates, DIAL_TIMEOUT_S)
        if seeds and not self._left:
            log.info("event=mesh_rejoined_known_peers peers=%d", len(seeds))
            gossip.join(seeds)

    # ---- links and messages --------------------------------------------------------------------
    def _link_settings(self, mesh: MeshSecret | None = None) -> LinkSettings:
        return LinkSettings(
            identity=self._signing_key,
            mesh=mesh or self._secret,
            trusted_issuer=self._trusted_issuer,
            check_invite=self.invites.check,
            on_stream=self._on_stream,
            on_message=self._on_message,
            fault=self._settings.fault,
        )

    def _trusted_issuer(self, node_id: str) -> bool:
        return node_id == self.node_id or (self._membership is not None and node_id in self._membership.members())

    def _addresses_of(self, peer_id: str) -> list[str]:
        # Any record, tombstones included: healing a partition means dialling peers we think are dead.
        rec = self._membership.record(peer_id) if self._membership is not None else None
        ann = rec.announcement if rec is not None else None
        if ann is None:
            return []
        return dial_urls(
            ann.extra, [addr_to_url(a) for a in ann.addresses], lambda p: self.link(p) is not None, me=self.node_id
        )

    def _link_up(self, peer_id: str) -> None:
        if self._gossip is not None:
            self._gossip.link_up(peer_id)
        self.invites.link_up(self.link(peer_id))

    def _link_down(self, peer_id: str) -> None:
        if self._gossip is not None:
            self._gossip.link_down(peer_id)

    async def _on_inbound_link(self, link: PeerLink) -> None:
        assert self._links is not None  # the listener runs in the session, after the table is set
        self._links.adopt(link)
        await link.wait_closed()

    async def _send(self, peer_id: str, wire: dict) -> None:
        link = await self.link_to(peer_id)
        await link.send_message({"t": "gossip", "m": wire})

    async def _on_message(self, link: PeerLink, body: dict) -> None:
        if body.get("t") == "gossip" and isinstance(body.get("m"), dict):
            if self._gossip is not None:
                await self._gossip.deliver(link.peer_id, body["m"])
        elif body.get("t") == REVOCATIONS_MESSAGE:
            await self.invites.on_message(link, body)
        else:
            self._counters["unknown_messages"] += 1
            log.warning("event=message_rejected peer=%s reason=unknown_type", link.peer_id[:16])

    async def _on_stream(self, link: PeerLink, header: dict, stream: LinkStream) -> None:
        if link.peer_id not in self.members():
            # Quarantine: a peer gets no work done here before its first valid (signed) announcement.
            self._counters["quarantined_streams"] += 1
            await stream.reset("quarantined", "no valid announcement from this peer yet")
            return
        handler = self._routes.handler_for(header)
        if handler is None:
            kind = header.get("kind")
            self._counters["bad_stream_headers"] += 1
            log.warning("event=stream_rejected peer=%s kind=%r", link.peer_id[:16], kind)
            await stream.reset("refused", f"unknown stream kind {kind!r}")
            return
        await handler(link, header, stream)

    # ---- our announcement and the peers we remember ----------------------------------------------
    def _announcement(self) -> Announcement:
        incarnation = self._membership.incarnation if self._membership is not None else self._incarnation
        return self._announcer.build(incarnation=incarnation, addresses=tuple(self._addresses))

    async def _announce_loop(self) -> None:
        """Re-check our announcement every ANNOUNCE_CHECK_S. Content the announcement cannot hold
        (the root's data, not validated here) is logged once per distinct reason, counted
        (``announce_errors``) and skipped: the last good announcement stays, the node carries on."""
        last_error = None
        while True:
            try:
                ann = self._announcement()
            except (ValueError, TypeError) as exc:  # InvalidMessage is a ValueError
                self._counters["announce_errors"] += 1
                if str(exc) != last_error:
                    last_error = str(exc)
                    log.error("event=announcement_invalid reason=%r action=keep_last", last_error)
            else:
                last_error = None
                if not self._left and self._announcer.changed(ann):
                    assert self._gossip is not None  # started by _enter after the gossip service
                    self._gossip.local_update(ann)  # the core stamps incarnation and seq, then re-signs
            await trio.sleep(ANNOUNCE_CHECK_S)

    async def _consume_events(self) -> None:
        # started by _enter in the session: its mesh, gossip and membership are set
        mesh_id, gossip, membership = self.mesh_id, self._gossip, self._membership
        assert mesh_id is not None and gossip is not None and membership is not None
        async for ev in gossip.events:
            if isinstance(ev, (PeerJoined, PeerUpdated)):
                self._peer_store.remember(mesh_id, membership.members())
            if isinstance(ev, PeerJoined) and self._links is not None:
                self._links.member_joined(ev.peer_id)  # the smaller id links ahead of need
            log.info(
                "event=membership_%s peer=%s incarnation=%s",
                type(ev).__name__.lower(),
                ev.peer_id[:16],
                getattr(ev, "incarnation", ""),
            )
            if self._on_event is not None:
                for kind, fields in self._feed.translate(ev):
                    self._on_event(kind, fields)
            # Links are not closed on PeerDied: a dead peer's link dies by itself (reset or idle
            # timeout), and closing a link to a falsely suspected peer only slows its refutation.

    # ---- status, invites -----------------------------------------------------------------------
    def peers(self) -> list[PeerRow]:
        if self._membership is None:
            return []
        return peer_rows(self._membership.statistics(trio.current_time()), self._membership.members(), self.link)

    def token(self) -> str | None:
        """A standing invite for /api/status (re-issued when close to expiry); None outside a mesh."""
        if self._secret is None:
            return None
        now = time.time()
        if self._token is None or self._token[1] - now < TOKEN_REFRESH_MARGIN_S or self._token[2] != self.mesh_id:
            self._token = (self.invite(self._settings.invite_ttl_s), now + self._settings.invite_ttl_s, self.mesh_id)
        return self._token[0]

    def invite(self, ttl_s: float, uses: int | None = None) -> str:
        """A new invite (recorded in HOME/mesh/invites.json; revocable; ``uses``: joiners it may admit)."""
        if self._secret is None:
            raise MeshError("this node is not in a mesh")
        return self.invites.issue(self._addresses, ttl_s, uses)

    def status(self) -> MeshStatus:
        links = self._links
        return mesh_section(
            mesh_id=self.mesh_id,
            port=self._port,
            addresses=self._addresses,
            role=self._settings.role,
            links={pid[:16]: link.statistics() for pid, link in (links.items() if links is not None else [])},
            handshake_failures=self._listener.statistics().handshake_failures if self._listener else {},
            gossip=self.gossip_statistics(),
            counters={
                **self._counters,
                "duplicate_links_closed": links.duplicate_links_closed if links is not None else 0,
                "dial_failures": links.dial_failures if links is not None else 0,
                "dials_deferred": links.dial_limiter.deferred if links is not None else 0,
                **(links.counters() if links is not None else {}),
                **(self._gossip.lag_counters() if self._gossip is not None else {}),
            },
            reachability=self.relays.reachability_view(),
            relays=self.relays.status(),
        )
