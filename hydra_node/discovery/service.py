"""DiscoveryService: choose a mesh (``--auto``), join it, then announce it (mDNS) and publish it (Nostr).

The root starts the mesh service without a plan, then ``discovery.run`` (instead of joining itself):

1. ``--auto`` (without ``--join``): browse the LAN (a browse-only :class:`MdnsService`) and Nostr
   (:class:`NostrDiscoverer`) for up to ``auto_wait_s`` — less once relays are synced and the LAN
   has had ``LAN_SETTLE_S``, or as soon as a LAN mesh we hold a credential for shows up; probe the
   invite addresses of the best listings (timed TCP connect); order the candidates
   (:func:`node_choice.ordered_candidates`) and try each with ``mesh.join(plan)``, falling back to the next;
   with none left, start (or resume) our own mesh (``mesh.join`` of an empty plan).
   Otherwise: ``mesh.join`` of the root's plan (``--join`` tokens, or none).
2. Remember the mesh in ``HOME/discovery/last_mesh.json``; start the mDNS responder (it browses
   too) and the Nostr publisher (``--publish``), and a loop that refreshes both when the node
   count or the models change.

Shutdown is the root's cancel: the publisher deletes its listing (NIP-09, shielded, ≤ 3 s)
and the responder multicasts a goodbye (≤ 1 s).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import trio

from hydra_node.discovery.adverts import AdvertisedMesh, listing_content, mdns_advert
from hydra_node.mesh.status_view import PeerRow
from hydra_node.discovery.auto import AutoContext, ListingProbe, rank_listings
from hydra_node.discovery.mdns.service import MdnsConfig, MdnsService
from hydra_node.discovery.mdns.wire import MdnsAdvertError
from hydra_node.discovery.node_choice import (
    CandidateSet,
    DiscoverySettings,
    JoinCandidate,
    LastMesh,
    held_credentials,
    ordered_candidates,
    lan_candidates,
    load_last_mesh,
    nostr_candidates,
    probe_address,
    save_last_mesh,
)
from hydra_node.discovery.nostr.events import ListingContent
from hydra_node.discovery.nostr.keys import NostrKeyError, load_or_create_nostr_keys
from hydra_node.discovery.nostr.services import (
    DiscovererConfig,
    NostrDiscoverer,
    NostrPublisher,
    PublisherConfig,
    relays_or_default,
)
from hydra_node.discovery.snapshot import LAN_SETTLE_S
from hydra_node.mesh.wire.errors import MeshError, TokenError
from hydra_node.mesh.joining import DialCandidate, JoinFailed, JoinPlan
from hydra_node.mesh.keyfile import load_mesh_key, mesh_key_path

__all__ = ["DiscoveryMesh", "DiscoveryPhase", "DiscoveryService", "NodeFacts"]

log = logging.getLogger("hydra.discovery.node")

REFRESH_CHECK_S = 2.0  # how often the advert / listing are compared with the node's state
LAN_FIRST_ANSWER_S = 0.3  # with Nostr listings in hand: unicast answers to the first query come in ms
PROBE_LIMIT = 8  # listings probed (timed TCP connect) before ranking
PROBE_TIMEOUT_S = 1.0
MAX_RECORDED_SKIPS = 32  # skipped listings kept for /api/status


class DiscoveryPhase(enum.Enum):
    IDLE = "idle"
    DISCOVERING = "discovering"
    JOINING = "joining"
    READY = "ready"


class DiscoveryMesh(AdvertisedMesh, Protocol):
    """What discovery needs of the mesh service (its public surface only)."""

    async def join(self, plan: JoinPlan) -> tuple[str, ...]: ...
    def peers(self) -> list[PeerRow]: ...


@dataclass(frozen=True)
class NodeFacts:
    """What discovery reads about the node, as callables the root supplies."""

    node_id: str
    name: str
    configured_models: frozenset[str]  # the models this node was started with (the --auto model bonus)
    ready_models: Callable[[], list[str]]  # local models ready to serve
    serving_models: Callable[[], list[str]]  # every model the router can reach (ours and peers')
    spare_slots: Callable[[], int]  # free request-queue slots of our ready models


class DiscoveryService:
    """Enters the mesh for the root (``plan``: the ``--join`` invites, or empty) — or, with ``--auto``,
    chooses which mesh — then keeps our mDNS advert and Nostr listing current. ``home`` holds the
    mesh key it reads, ``discovery/last_mesh.json`` and the Nostr key."""

    def __init__(
        self,
        mesh: DiscoveryMesh,
        node: NodeFacts,
        settings: DiscoverySettings,
        *,
        home: Path,
        plan: JoinPlan | None = None,
    ) -> None:
        self.mesh = mesh
        self.node = node
        self.settings = settings
        self.home = home
        self.plan = plan or JoinPlan()
        self.responder: MdnsService | None = None
        self.publisher: NostrPublisher | None = None
        self.phase = DiscoveryPhase.IDLE
        self.auto: dict[str, Any] = {}
        self._last_key: tuple | None = None
        self._nostr_keys = None
        if settings.publish:  # load (or create) the key now, so a bad key file stops the start-up plainly
            try:
                self._nostr_keys = load_or_create_nostr_keys(home)
            except NostrKeyError as exc:
                raise RuntimeError(str(exc)) from None

    # ---- lifecycle -----------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[DiscoveryService] = trio.TASK_STATUS_IGNORED) -> None:
        """Join (choosing the mesh with ``--auto``), then announce and publish until cancelled."""
        async with trio.open_nursery() as nursery:
            if self.settings.auto and not self.plan.invites:
                joined_with = await self._auto_join()
            else:
                await self.mesh.join(self.plan)
                joined_with = self.plan.invites[0].text if self.plan.invites else None
            self._remember(joined_with)
            if self.settings.use_mdns:
                self.responder = MdnsService(self._mdns_config(), self._advert())
                await nursery.start(self.responder.run)
            if self.settings.publish:
                self.publisher = NostrPublisher(
                    self._nostr_keys,
                    self._listing,
                    PublisherConfig(
                        relays=relays_or_default(self.settings.relays),
                        interval_s=self.settings.publish_interval_s,
                        ttl_s=self.settings.listing_ttl_s,
                    ),
                )
                await nursery.start(self.publisher.run)
                log.info(
                    "event=nostr_publishing pubkey=%s relays=%s",
                    self.publisher.pubkey,
                    ",".join(self.publisher.config.relays),
                )
            self._last_key = self._state_key()
            nursery.start_soon(self._refresh_loop)
            self.phase = DiscoveryPhase.READY
            task_status.started(self)

    def _mdns_config(self) -> MdnsConfig:
        s = self.settings
        return MdnsConfig(group=s.mdns_group, port=s.mdns_port, interface=s.mdns_interface)

    # ---- --auto --------------------------------------------------------------------------
    async def _auto_join(self) -> str | None:
        """Discover, try the candidates in order; returns the invite token joined with (None: own mesh)."""
        s = self.settings
        self.phase = DiscoveryPhase.DISCOVERING
        t0 = trio.current_time()
        now = time.time()
        last = load_last_mesh(self.home)
        held = held_credentials(load_mesh_key(mesh_key_path(self.home)), last, now)
        lan, nostr = await self._scan(held, last)
        candidates = ordered_candidates(lan, nostr)
        self.auto = {
            "discovery_s": round(trio.current_time() - t0, 3),
            "candidates": [c.describe() for c in candidates],
            "skipped": [dataclasses.asdict(x) for x in lan.skipped + nostr.skipped][:MAX_RECORDED_SKIPS],
            "attempts": [],
            "outcome": None,
        }
        log.info(
            "event=auto_discovered lan=%d nostr=%d plan=%d in_s=%.2f",
            len(lan.candidates),
            len(nostr.candidates),
            len(candidates),
            self.auto["discovery_s"],
        )
        self.phase = DiscoveryPhase.JOINING
        members = [c for c in candidates if c.token is None]
        if members:  # we are a member of a mesh seen on the LAN: resume it and dial its nodes
            for cand in members:
                if await self.mesh.join(JoinPlan(members=(DialCandidate(cand.urls, cand.peer_id),))):
                    self._outcome("joined", cand)
                    return None
                self.auto["attempts"].append({**cand.describe(), "error": "unreachable"})
            self._outcome("resumed", None)
            return None
        for cand in candidates:
            assert cand.token is not None  # the candidates without one (members) were resumed above
            try:
                plan = JoinPlan.from_tokens((cand.token,), time.time(), admission_timeout_s=s.join_attempt_s)
                await self.mesh.join(plan)
            except (JoinFailed, MeshError, TokenError) as exc:
                self.auto["attempts"].append({**cand.describe(), "error": str(exc)[:300]})
                log.warning(
                    "event=auto_join_failed source=%s mesh_id=%s error=%r", cand.source, cand.mesh_id, str(exc)[:300]
                )
                continue
            self._outcome("joined", cand)
            return cand.token
        await self.mesh.join(JoinPlan())
        self._outcome("created" if not candidates else "created_after_failures", None)
        return None

    def _outcome(self, what: str, cand: JoinCandidate | None) -> None:
        self.auto["outcome"] = what
        self.auto["mesh_id"] = self.mesh.mesh_id
        if cand is not None:
            self.auto["chosen"] = cand.describe()
        log.info("event=auto_%s mesh_id=%s source=%s", what, self.auto["mesh_id"], cand.source if cand else "-")

    async def _scan(self, held, last: LastMesh | None) -> tuple[CandidateSet, CandidateSet]:
        s = self.settings
        node_id = self.node.node_id
        last_id = last.mesh_id if last else None
        browser = MdnsService(self._mdns_config(), None) if s.use_mdns else None
        discoverer = (
            NostrDiscoverer(DiscovererConfig(relays=relays_or_default(s.relays))) if s.use_nostr_discovery else None
        )
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
                ctx = AutoContext(
                    now=int(time.time()),
                    last_mesh_id=last_id,
                    mesh_name=s.mesh_name,
                    local_models=self.node.configured_models,
                )
                pre = rank_listings(listings, ctx)[:PROBE_LIMIT]
                probes = await self._probe([x.listing for x in pre])
                ranked = rank_listings(listings, dataclasses.replace(ctx, probes=probes))
                nostr = nostr_candidates(ranked, node_id=node_id, now=time.time())
            scan.cancel_scope.cancel()
        return lan, nostr

    async def _probe(self, listings) -> dict:
        probes: dict = {}

        async def one(listing) -> None:
            probes[listing.key] = ListingProbe(False)
            target = probe_address(listing.content.invite_token, time.time())
            if target is None:
                return
            t0 = trio.current_time()
            with trio.move_on_after(PROBE_TIMEOUT_S):
                try:
                    stream = await trio.open_tcp_stream(*target)
                except OSError:
                    return
                await stream.aclose()
                probes[listing.key] = ListingProbe(True, (trio.current_time() - t0) * 1000.0)

        async with trio.open_nursery() as n:
            for listing in listings:
                n.start_soon(one, listing)
        return probes

    # ---- what we announce and publish ----------------------------------------------------
    def _remember(self, token: str | None) -> None:
        if self.mesh.mesh_id is None:
            return
        try:
            save_last_mesh(self.home, LastMesh(self.mesh.mesh_id, time.time(), token))
        except OSError as exc:
            log.warning("event=last_mesh_not_saved error=%r", exc)

    def _alive_peers(self) -> list[PeerRow]:
        return [p for p in self.mesh.peers() if p.state == "alive"]

    def _advert(self):
        origin = self.responder.origin if self.responder is not None else None
        return mdns_advert(
            self.mesh,
            node_id=self.node.node_id,
            name=self.node.name,
            ready_models=self.node.ready_models(),
            alive_peers=len(self._alive_peers()),
            fallback_ip=self.settings.mdns_interface,
            origin=origin,
        )

    def _listing(self) -> ListingContent | None:
        if self.mesh.mesh_id is None or self.mesh.port is None:
            return None
        return listing_content(
            self.mesh,
            self.settings,
            peers=self._alive_peers(),
            serving=self.node.serving_models(),
            spare_slots=self.node.spare_slots(),
        )

    def _state_key(self) -> tuple:
        return (
            len(self._alive_peers()),
            tuple(self.node.ready_models()),
            tuple(sorted(self.node.serving_models())),
            self.mesh.mesh_id,
        )

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
        out: dict[str, Any] = {
            "mode": s.mode,
            "phase": self.phase.value,
            "auto": s.auto,
            "publish": s.publish,
            "mdns": None,
            "nostr": None,
        }
        if s.auto:
            out["auto_result"] = self.auto
        if self.responder is not None:
            st = self.responder.statistics()
            out["mdns"] = {
                "group": s.mdns_group,
                "port": s.mdns_port,
                "announcements_sent": st.announcements_sent,
                "rejected_adverts": st.rejected_adverts,
                "malformed": st.malformed,
                "lan": [
                    {
                        "instance": a.instance,
                        "node_id": a.node_id,
                        "name": a.name,
                        "mesh_id": a.mesh_id,
                        "addresses": list(a.addresses),
                        "port": a.port,
                        "models": list(a.models),
                        "node_count": a.node_count,
                        "version": a.version,
                    }
                    for a in self.responder.adverts()
                ],
            }
        if self.publisher is not None:
            pst = self.publisher.statistics()
            out["nostr"] = {
                "pubkey": self.publisher.pubkey,
                "published": pst.published,
                "withdrawn": pst.withdrawn,
                "event_id": pst.current_event_id,
                "relays": [
                    {
                        "url": r.url,
                        "connected": r.connected,
                        "ok_accepted": r.ok_accepted,
                        "ok_rejected": r.ok_rejected,
                        "last_error": r.last_error,
                    }
                    for r in pst.relays
                ],
            }
        return out
