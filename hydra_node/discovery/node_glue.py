"""Discovery inside ``serve``: choose a mesh (``--auto``), start it, then announce it (mDNS) and publish it (Nostr).

:class:`NodeDiscovery` replaces ``node.mesh.run`` in the node's start-up when any discovery is on
(``Node.run`` starts ``discovery.run`` instead).  ``run`` is a long-lived task:

1. ``--auto`` (without ``--join``): browse the LAN (a browse-only :class:`MdnsService`) and Nostr
   (:class:`NostrDiscoverer`) for up to ``auto_wait_s`` — less once relays are synced and the LAN
   has had ``LAN_SETTLE_S``, or as soon as a LAN mesh we hold a credential for shows up; probe the
   invite addresses of the best listings (timed TCP connect); build the join plan
   (:func:`node_choice.join_plan`) and try it in order, falling back to the next candidate; with
   none left, start (or resume) our own mesh.
2. Start the mesh (``MeshService.run``) — with the chosen invite token as ``join``.
3. Remember the mesh in ``HOME/discovery/last_mesh.json``; start the mDNS responder (it browses
   too) and the Nostr publisher (``--publish``), and a loop that refreshes both when the node
   count or the models change.

Shutdown is the node's root cancel: the publisher deletes its listing (NIP-09, shielded, ≤ 3 s)
and the responder multicasts a goodbye (≤ 1 s).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import secrets
import time
from typing import Any

import trio

from hydra_node import __version__
from hydra_node.discovery.auto import AutoContext, Probe, rank_listings
from hydra_node.discovery.mdns import MdnsConfig, MdnsService
from hydra_node.discovery.mdns_wire import MAX_ADDRESSES, MAX_MODELS, MdnsAdvert, MdnsAdvertError
from hydra_node.discovery.node_choice import (
    CandidateSet,
    DiscoverySettings,
    JoinCandidate,
    LastMesh,
    held_credentials,
    join_plan,
    lan_candidates,
    lan_fingerprint,
    load_last_mesh,
    nostr_candidates,
    probe_address,
    save_last_mesh,
)
from hydra_node.discovery.nostr_events import ListingContent
from hydra_node.discovery.nostr_keys import NostrKeyError, load_or_create_nostr_keys
from hydra_node.discovery.nostr_services import (
    DiscovererConfig,
    NostrDiscoverer,
    NostrPublisher,
    PublisherConfig,
    relays_or_default,
)
from hydra_node.discovery.snapshot import LAN_SETTLE_S
from hydra_node.mesh.errors import MeshError, TokenError
from hydra_node.mesh.service import DIAL_TIMEOUT_S, JoinFailed, load_or_create_mesh_key
from hydra_node.mesh.token import parse_invite

log = logging.getLogger("hydra.discovery.node")

REFRESH_CHECK_S = 2.0  # how often the advert / listing are compared with the node's state
LAN_FIRST_ANSWER_S = 0.3  # with Nostr listings in hand: unicast answers to the first query come in ms
PROBE_LIMIT = 8  # listings probed (timed TCP connect) before ranking
PROBE_TIMEOUT_S = 1.0
MAX_LISTED_MODELS = 32  # ListingContent bound
MAX_MODEL_NAME = 128


def _join_failure(exc: BaseException) -> BaseException | None:
    """The join failure inside ``exc`` (a bare one or a group of only such), else None."""
    if isinstance(exc, (JoinFailed, MeshError)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = [_join_failure(e) for e in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None


class NodeDiscovery:
    def __init__(self, node, settings: DiscoverySettings):
        self.node = node
        self.settings = settings
        self.responder: MdnsService | None = None
        self.publisher: NostrPublisher | None = None
        self.phase = "idle"  # idle | discovering | joining | ready
        self.auto: dict[str, Any] = {}
        self._last_key: tuple | None = None
        self._nostr_keys = None
        if settings.publish:  # load (or create) the key now, so a bad key file stops the start-up plainly
            try:
                self._nostr_keys = load_or_create_nostr_keys(node.home)
            except NostrKeyError as exc:
                raise RuntimeError(str(exc)) from None
        node.add_status_section("discovery", self.status)

    # ---- lifecycle -----------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        mesh = self.node.mesh
        async with trio.open_nursery() as nursery:
            joined_with: str | None = None
            if self.settings.auto and not mesh.settings.join:
                joined_with = await self._auto_join(nursery)
            else:
                await nursery.start(mesh.run)
                joined_with = mesh.settings.join[0] if mesh.settings.join else None
            self._remember(joined_with)
            if self.settings.use_mdns:
                advert = self._advert()
                self.responder = MdnsService(self._mdns_config(), advert)
                await nursery.start(self.responder.run)
            if self.settings.publish:
                self.publisher = NostrPublisher(self._nostr_keys, self._listing, PublisherConfig(
                    relays=relays_or_default(self.settings.relays), interval_s=self.settings.publish_interval_s,
                    ttl_s=self.settings.listing_ttl_s))
                await nursery.start(self.publisher.run)
                log.info("event=nostr_publishing pubkey=%s relays=%s", self.publisher.pubkey,
                         ",".join(self.publisher.config.relays))
            self._last_key = self._state_key()
            nursery.start_soon(self._refresh_loop)
            self.phase = "ready"
            task_status.started(self)

    def _mdns_config(self) -> MdnsConfig:
        s = self.settings
        return MdnsConfig(group=s.mdns_group, port=s.mdns_port, interface=s.mdns_interface)

    # ---- --auto --------------------------------------------------------------------------
    async def _auto_join(self, nursery: trio.Nursery) -> str | None:
        """Discover, try the plan in order; returns the invite token joined with (None: own mesh)."""
        mesh = self.node.mesh
        s = self.settings
        self.phase = "discovering"
        t0 = trio.current_time()
        now = time.time()
        last = load_last_mesh(self.node.home)
        held = held_credentials(load_or_create_mesh_key(self.node.home), last, now)
        lan, nostr = await self._scan(held, last)
        plan = join_plan(lan, nostr)
        self.auto = {"discovery_s": round(trio.current_time() - t0, 3),
                     "candidates": [c.describe() for c in plan],
                     "skipped": [dataclasses.asdict(x) for x in lan.skipped + nostr.skipped][:32],
                     "attempts": [], "outcome": None}
        log.info("event=auto_discovered lan=%d nostr=%d plan=%d in_s=%.2f", len(lan.candidates),
                 len(nostr.candidates), len(plan), self.auto["discovery_s"])
        self.phase = "joining"
        original = mesh.settings
        member = [c for c in plan if c.token is None]
        if member:  # we are a member of a mesh seen on the LAN: resume it and dial its nodes
            await nursery.start(mesh.run)
            for cand in member:
                if await self._dial_member(cand):
                    self._outcome("joined", cand)
                    return None
            self._outcome("resumed", None)
            return None
        for cand in plan:
            mesh.settings = dataclasses.replace(original, join=(cand.token,),
                                                join_timeout_s=min(original.join_timeout_s, s.join_attempt_s))
            try:
                await nursery.start(mesh.run)
            except BaseException as exc:  # noqa: BLE001 - only join failures are swallowed, see below
                failure = _join_failure(exc)
                if failure is None:
                    raise
                self.auto["attempts"].append({**cand.describe(), "error": str(failure)[:300]})
                log.warning("event=auto_join_failed source=%s mesh_id=%s error=%r", cand.source, cand.mesh_id,
                            str(failure)[:300])
                mesh.settings = original
                mesh.links.clear()
                continue
            self._outcome("joined", cand)
            return cand.token
        mesh.settings = original
        await nursery.start(mesh.run)
        self._outcome("created" if not plan else "created_after_failures", None)
        return None

    def _outcome(self, what: str, cand: JoinCandidate | None) -> None:
        self.auto["outcome"] = what
        self.auto["mesh_id"] = self.node.mesh.mesh.mesh_id if self.node.mesh.mesh else None
        if cand is not None:
            self.auto["chosen"] = cand.describe()
        log.info("event=auto_%s mesh_id=%s source=%s", what, self.auto["mesh_id"], cand.source if cand else "-")

    async def _dial_member(self, cand: JoinCandidate) -> bool:
        mesh = self.node.mesh
        link = await mesh._dial_urls(list(cand.urls), cand.peer_id, DIAL_TIMEOUT_S)  # member-to-member link
        if link is None:
            self.auto["attempts"].append({**cand.describe(), "error": "unreachable"})
            return False
        mesh.gossip.join([link.peer_id])
        return True

    async def _scan(self, held, last: LastMesh | None) -> tuple[CandidateSet, CandidateSet]:
        s = self.settings
        node_id = self.node.node_id
        last_id = last.mesh_id if last else None
        browser = MdnsService(self._mdns_config(), None) if s.use_mdns else None
        discoverer = (NostrDiscoverer(DiscovererConfig(relays=relays_or_default(s.relays)))
                      if s.use_nostr_discovery else None)
        lan = nostr = CandidateSet(())
        async with trio.open_nursery() as scan:
            start = trio.current_time()
            if browser is not None:
                await scan.start(browser.run)
            if discoverer is not None:
                await scan.start(discoverer.run)

            def lan_found(adverts) -> bool:
                return bool(lan_candidates(adverts, held, node_id=node_id, last_mesh_id=last_id).candidates)

            def lan_seen() -> bool:
                return browser is not None and lan_found(browser.adverts())

            with trio.move_on_after(s.auto_wait_s):
                if browser is not None:  # a LAN mesh we can enter goes first: no need to wait for relays
                    with trio.move_on_at(start + (LAN_FIRST_ANSWER_S if discoverer is not None else LAN_SETTLE_S)):
                        await browser.wait_for(lan_found)
                if discoverer is not None and not lan_seen():
                    await discoverer.wait_synced()
                    if browser is not None and not discoverer.listings():  # nothing else to go on: let the LAN settle
                        with trio.move_on_at(start + LAN_SETTLE_S):
                            await browser.wait_for(lan_found)
            if browser is not None:
                lan = lan_candidates(browser.adverts(), held, node_id=node_id, last_mesh_id=last_id)
            if discoverer is not None and not any(c.token is None for c in lan.candidates):
                listings = discoverer.listings()
                ctx = AutoContext(now=int(time.time()), last_mesh_id=last_id, mesh_name=s.mesh_name,
                                  local_models=frozenset(m.id for m in self.node.models))
                pre = rank_listings(listings, ctx)[:PROBE_LIMIT]
                probes = await self._probe([x.listing for x in pre])
                ranked = rank_listings(listings, dataclasses.replace(ctx, probes=probes))
                nostr = nostr_candidates(ranked, node_id=node_id, now=time.time())
            scan.cancel_scope.cancel()
        return lan, nostr

    async def _probe(self, listings) -> dict:
        probes: dict = {}

        async def one(listing) -> None:
            target = probe_address(listing.content.invite_token, time.time())
            if target is None:
                probes[listing.key] = Probe(False)
                return
            t0 = trio.current_time()
            with trio.move_on_after(PROBE_TIMEOUT_S):
                try:
                    stream = await trio.open_tcp_stream(*target)
                except OSError:
                    probes[listing.key] = Probe(False)
                    return
                await stream.aclose()
                probes[listing.key] = Probe(True, (trio.current_time() - t0) * 1000.0)
                return
            probes[listing.key] = Probe(False)

        async with trio.open_nursery() as n:
            for listing in listings:
                n.start_soon(one, listing)
        return probes

    # ---- what we announce and publish ----------------------------------------------------
    def _remember(self, token: str | None) -> None:
        mesh = self.node.mesh
        if mesh.mesh is None:
            return
        try:
            save_last_mesh(self.node.home, LastMesh(mesh.mesh.mesh_id, time.time(), token))
        except OSError as exc:
            log.warning("event=last_mesh_not_saved error=%r", exc)

    def _alive_peers(self) -> list[dict]:
        return [p for p in self.node.mesh.peers() if p.get("state") == "alive"]

    def _local_ready_models(self) -> list[str]:
        return sorted(r.model.id for r in self.node.local.runners.values() if r.state == "ready")

    def _advert(self) -> MdnsAdvert:
        node, mesh = self.node, self.node.mesh
        ips: list[str] = []
        for addr in mesh.addresses:
            host = addr.split("://", 1)[-1].rsplit(":", 1)[0]
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                continue
            if host not in ips:
                ips.append(host)
        if any(not ip.startswith("127.") for ip in ips):  # loopback only when it is all we have
            ips = [ip for ip in ips if not ip.startswith("127.")]
        if not ips:
            ips = [self.settings.mdns_interface if self.settings.mdns_interface != "0.0.0.0" else "127.0.0.1"]
        name = "".join(ch for ch in (node.config.name or node.node_id[:8]) if ch.isprintable() and ch != "|")[:64]
        models = self._local_ready_models()[:MAX_MODELS]
        origin = self.responder.origin if self.responder is not None else None
        while True:
            try:
                kw = dict(instance=f"hydra-{node.node_id[:12]}", port=mesh.port, addresses=tuple(ips[:MAX_ADDRESSES]),
                          node_id=node.node_id, mesh_id=mesh.mesh.mesh_id, token_fingerprint=lan_fingerprint(mesh.mesh),
                          name=name, models=tuple(models), node_count=min(1 + len(self._alive_peers()), 100_000),
                          version=__version__)
                return MdnsAdvert(**kw, origin=origin or secrets.token_hex(8))
            except MdnsAdvertError:
                if not models:
                    raise
                models = models[:-1]  # the TXT string is full: list fewer models

    def _listing(self) -> ListingContent | None:
        node, mesh = self.node, self.node.mesh
        if mesh.mesh is None or mesh.port is None:
            return None
        peers = self._alive_peers()
        serving = sorted({m.id for m in node.router.models() if 0 < len(m.id) <= MAX_MODEL_NAME
                          and m.id.isprintable()})[:MAX_LISTED_MODELS]
        queue_size = node.runner_settings().queue_size
        spare = sum(max(0, queue_size - r.queue_depth - r.in_flight) for r in node.local.runners.values()
                    if r.state == "ready")
        token = mesh.token()
        try:
            if parse_invite(token, time.time()).mesh_id != mesh.mesh.mesh_id:  # cached before a join switched meshes
                token = mesh.invite(mesh.settings.invite_ttl_s)
        except TokenError:
            token = mesh.invite(mesh.settings.invite_ttl_s)
        return ListingContent(
            mesh_id=mesh.mesh.mesh_id, invite_token=token, serving=tuple(serving),
            node_count=min(1 + len(peers), 1_000_000),
            client_count=min(sum(1 for p in peers if p.get("role") == "client"), 1_000_000),
            max_clients=self.settings.max_clients, spare_slots=min(spare, 1_000_000),
            name=self.settings.mesh_name, region=self.settings.region, version=__version__[:64])

    def _state_key(self) -> tuple:
        peers = self._alive_peers()
        return (len(peers), tuple(self._local_ready_models()),
                tuple(sorted(m.id for m in self.node.router.models())), self.node.mesh.mesh.mesh_id)

    async def _refresh_loop(self) -> None:
        while True:
            await trio.sleep(REFRESH_CHECK_S)
            key = self._state_key()
            if key == self._last_key:
                continue
            self._last_key = key
            if self.responder is not None:
                try:
                    self.responder.update_advert(self._advert())
                except (MdnsAdvertError, ValueError) as exc:
                    log.warning("event=mdns_advert_not_updated error=%r", exc)
            if self.publisher is not None:
                self.publisher.refresh()

    # ---- status ----------------------------------------------------------------------------
    def status(self) -> dict:
        s = self.settings
        out: dict[str, Any] = {"mode": s.mode, "phase": self.phase, "auto": s.auto, "publish": s.publish,
                               "mdns": None, "nostr": None}
        if s.auto:
            out["auto_result"] = self.auto
        if self.responder is not None:
            st = self.responder.statistics()
            out["mdns"] = {
                "group": s.mdns_group, "port": s.mdns_port,
                "announcements_sent": st.announcements_sent, "rejected_adverts": st.rejected_adverts,
                "malformed": st.malformed,
                "lan": [{"instance": a.instance, "node_id": a.node_id, "name": a.name, "mesh_id": a.mesh_id,
                         "addresses": list(a.addresses), "port": a.port, "models": list(a.models),
                         "node_count": a.node_count, "version": a.version} for a in self.responder.adverts()]}
        if self.publisher is not None:
            st = self.publisher.statistics()
            out["nostr"] = {"pubkey": self.publisher.pubkey, "published": st.published, "withdrawn": st.withdrawn,
                            "event_id": st.current_event_id,
                            "relays": [{"url": r.url, "connected": r.connected, "ok_accepted": r.ok_accepted,
                                        "ok_rejected": r.ok_rejected, "last_error": r.last_error}
                                       for r in st.relays]}
        return out
