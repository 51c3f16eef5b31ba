"""MeshService: the node's part in the mesh.

It owns the mesh key (``HOME/mesh/mesh.key``, 0600), the link listener, one link per
peer, the gossip driver around the membership core, invite tokens and joining,
remote generation in both directions (``generate`` streams), and tunnels (``tunnel``
streams, used by llama.cpp RPC).  The node plugs it in as a target source for the
router and as a section of ``/api/status``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import stat
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import trio

from hydra_node import __version__
from hydra_node.inference import (GenerationError, GenerationEvent, GenerationRequest, InvalidRequest,
                                  ModelUnavailable, event_from_wire)
from hydra_node.mesh.addresses import advertised_addresses
from hydra_node.mesh.announce_sig import sign_announcement, verify_announcement
from hydra_node.mesh.endpoints import LinkListener, connect_link
from hydra_node.mesh.errors import HandshakeError, LinkClosed, MeshError, StreamReset, TokenError
from hydra_node.mesh.faults import FaultInjection
from hydra_node.mesh.gossip import GossipService
from hydra_node.mesh.ids import MESH_KEY_BYTES, MeshSecret
from hydra_node.mesh.link import LinkSettings, PeerLink
from hydra_node.mesh.membership import Announcement, Hardware, Membership, MembershipConfig, ModelEntry
from hydra_node.mesh.stream import LinkStream
from hydra_node.mesh.token import InviteToken, addr_to_url, issue_invite, parse_invite
from hydra_node.router import Target
from hydra_node.runtime.channel import ChannelError, FrameDecoder, encode_frame

log = logging.getLogger("hydra.mesh")

#: How often our announcement is re-checked for changes (queue depth, model states).
ANNOUNCE_CHECK_S = 0.5
#: How long a caller waits for a link to be dialled.
DIAL_TIMEOUT_S = 3.0
#: Bound on one background dial of a peer (all its addresses, handshake included).
BACKGROUND_DIAL_TIMEOUT_S = 10.0
#: Peers whose addresses are remembered in HOME/mesh/peers.json for a restart without --join.
MAX_REMEMBERED_PEERS = 64
#: Bound on the Leave broadcast at shutdown.
LEAVE_TIMEOUT_S = 2.0
#: A fresh /api/status token is issued when the current one has less than this left.
TOKEN_REFRESH_MARGIN_S = 3600.0
#: Stream frames are runner-channel frames; a generation event is small.
STREAM_READ_LIMIT = 1 << 20
#: Bound on closing a generation stream (reset or reading the final EOF).
STREAM_CLOSE_TIMEOUT_S = 2.0


#: Handshake refusals that retrying cannot fix.
PERMANENT_JOIN_ERRORS = ("token_expired", "token_forged", "token_foreign_mesh", "token_malformed", "foreign_mesh",
                         "admission_refused", "rejected_by_peer", "generation_mismatch",
                         "peer_authentication_failed")


class JoinFailed(Exception):
    """`--join` could not reach or be admitted by any address in the token."""


@dataclass(frozen=True)
class MeshSettings:
    listen_host: str = "0.0.0.0"
    listen_port: int = 9338
    advertise: tuple[str, ...] = ()
    join: tuple[str, ...] = ()
    role: str = "host"  # host | worker | client
    join_timeout_s: float = 30.0
    invite_ttl_s: float = 24 * 3600.0
    membership: MembershipConfig = field(default_factory=MembershipConfig)
    fault: FaultInjection | None = None


def load_or_create_mesh_key(home: Path) -> MeshSecret | None:
    path = home / "mesh" / "mesh.key"
    if not path.exists():
        return None
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise MeshError(f"{path} is readable by other users; run: chmod 600 {path}")
    try:
        key = bytes.fromhex(path.read_text().strip())
        if len(key) != MESH_KEY_BYTES:
            raise ValueError("wrong length")
    except ValueError as exc:
        raise MeshError(f"{path} is corrupt ({exc}); remove it to start a new mesh") from None
    return MeshSecret(key)


def save_mesh_key(home: Path, mesh: MeshSecret) -> None:
    path = home / "mesh" / "mesh.key"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(mesh.mesh_key.hex() + "\n")
    os.replace(tmp, path)


class MeshService:
    """Start with ``await nursery.start(mesh.run)``; it reports ready once listening (and joined)."""

    def __init__(self, node, settings: MeshSettings):
        self.node = node
        self.settings = settings
        self.identity = node.identity
        self.node_id = node.node_id
        self.mesh: MeshSecret | None = None
        self.port: int | None = None
        self.addresses: list[str] = []
        self.links: dict[str, PeerLink] = {}
        self.gossip: GossipService | None = None
        self.membership: Membership | None = None
        self._listener: LinkListener | None = None
        self._nursery: trio.Nursery | None = None
        self._dialing: dict[str, trio.Event] = {}
        self._last_ann: tuple | None = None
        self._token: tuple[str, float] | None = None
        self._remembered: dict | None = None
        self.incarnation = int(time.time())  # higher than any incarnation of an earlier run
        self.counters = {"remote_generations_served": 0, "remote_generations_opened": 0,
                         "remote_generation_errors": 0, "bad_stream_headers": 0, "unknown_messages": 0,
                         "duplicate_links_closed": 0, "dial_failures": 0, "quarantined_streams": 0}
        self.tunnel_handlers: dict[str, Callable[[PeerLink, dict, LinkStream], Awaitable[None]]] = {}
        #: Callables returning entries merged into our announcement's ``extra`` (e.g. the telemetry
        #: summary, hydra_node/routing/live.py). Return the same value until it really changed:
        #: a changed ``extra`` is a new announcement.
        self.extra_sources: list[Callable[[], dict]] = []

    # ---- lifecycle ------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        tokens = [parse_invite(t, time.time()) for t in self.settings.join]  # TokenError: caller reports it
        self.mesh = load_or_create_mesh_key(self.node.home)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            first_link = None
            if tokens and (self.mesh is None or self.mesh.mesh_id != tokens[0].mesh_id):
                first_link = await self._join_with_invite(tokens[0])
                self.mesh = first_link.mesh
                save_mesh_key(self.node.home, self.mesh)
                log.info("event=mesh_joined mesh_id=%s via=%s", self.mesh.mesh_id, first_link.peer_id[:16])
            elif self.mesh is None:
                self.mesh = MeshSecret.generate()
                save_mesh_key(self.node.home, self.mesh)
                log.info("event=mesh_created mesh_id=%s", self.mesh.mesh_id)
            self._listener = LinkListener(self._link_settings(), on_link=self._on_inbound_link)
            self.port = await nursery.start(self._listener.serve, self.settings.listen_host,
                                            self.settings.listen_port)
            self.addresses = advertised_addresses(self.settings.listen_host, self.port, self.settings.advertise)
            self.membership = Membership(self._announcement(), self.settings.membership,
                                         now=trio.current_time(), verify=verify_announcement,
                                         sign=partial(sign_announcement, self.identity.signing_key))
            self.gossip = await nursery.start(GossipService(
                self.membership, self._send,
                send_errors=(MeshError, OSError, trio.BrokenResourceError, trio.ClosedResourceError)).run)
            nursery.start_soon(self._consume_events)
            nursery.start_soon(self._announce_loop)
            seeds = []
            if first_link is not None:
                self._adopt(first_link)
                seeds.append(first_link.peer_id)
            for tok in tokens:
                if tok.issuer_id not in self.links:
                    link = await self._dial_urls(tok.urls, tok.issuer_id, self.settings.join_timeout_s
                                                 if first_link is None else DIAL_TIMEOUT_S)
                    if link is not None:
                        seeds.append(link.peer_id)
                elif tok.issuer_id not in seeds:
                    seeds.append(tok.issuer_id)
            if tokens and not seeds:
                raise JoinFailed(f"could not reach any address of the invite ({', '.join(tokens[0].addrs)})")
            if seeds:
                self.gossip.join(seeds)
            elif not tokens:
                nursery.start_soon(self._rejoin_known_peers)
            log.info("event=mesh_ready mesh_id=%s port=%d addresses=%s", self.mesh.mesh_id, self.port,
                     ",".join(self.addresses))
            task_status.started(self)
            await trio.sleep_forever()

    async def leave(self) -> None:
        """Tell peers we are leaving (bounded) so they drop us at once instead of probing."""
        if self.gossip is None:
            return
        with trio.move_on_after(LEAVE_TIMEOUT_S):
            await self.gossip.leave()
            # Close links gracefully: this flushes the queued Leave before the sockets go away,
            # so peers see "left" at once instead of suspecting a crash.
            async with trio.open_nursery() as nursery:
                for link in list(self.links.values()):
                    nursery.start_soon(link.aclose, "leaving", "node shutting down")

    def _link_settings(self, mesh: MeshSecret | None = None) -> LinkSettings:
        return LinkSettings(identity=self.identity.signing_key, mesh=mesh or self.mesh,
                            trusted_issuer=self._trusted_issuer, on_stream=self._on_stream,
                            on_message=self._on_message, fault=self.settings.fault)

    def _trusted_issuer(self, node_id: str) -> bool:
        return node_id == self.node_id or (self.membership is not None and node_id in self.membership.members())

    async def _join_with_invite(self, token: InviteToken) -> PeerLink:
        """Dial the token's addresses with the invite, retrying with back-off until join_timeout_s."""
        deadline = trio.current_time() + self.settings.join_timeout_s
        delay, last = 0.25, "no address tried"
        settings = self._link_settings(mesh=None)
        while True:
            for url in token.urls:
                try:
                    with trio.fail_after(DIAL_TIMEOUT_S * 2):
                        return await self._nursery.start(partial(connect_link, url, settings, invite=token,
                                                                  expected_peer_id=token.issuer_id))
                except HandshakeError as exc:
                    if exc.code in PERMANENT_JOIN_ERRORS and "busy" not in str(exc):
                        raise JoinFailed(f"{url} refused the invite: {exc}") from None
                    last = f"{url}: {exc}"
                except (LinkClosed, MeshError, OSError, trio.TooSlowError) as exc:
                    last = f"{url}: {exc or type(exc).__name__}"
            if trio.current_time() + delay > deadline:
                raise JoinFailed(f"could not join the mesh within {self.settings.join_timeout_s:.0f} s; "
                                 f"last error: {last}")
            log.warning("event=join_retry in_s=%.2f last_error=%r", delay, last)
            await trio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 5.0)

    # ---- links ------------------------------------------------------------------------
    def _initiator_of(self, link: PeerLink) -> str:
        return self.node_id if link.is_initiator else link.peer_id

    def _adopt(self, link: PeerLink) -> None:
        """Keep one link per peer: the one initiated by the smaller node id (both sides agree)."""
        old = self.links.get(link.peer_id)
        if old is not None and old is not link and not old.closed:
            keep, drop = sorted((old, link), key=self._initiator_of)
            if drop is link:
                self.counters["duplicate_links_closed"] += 1
                self._nursery.start_soon(drop.aclose, "duplicate", "another link to this peer is kept")
                return
            self.counters["duplicate_links_closed"] += 1
            self._nursery.start_soon(old.aclose, "duplicate", "another link to this peer is kept")
        self.links[link.peer_id] = link
        self._nursery.start_soon(self._watch_link, link)
        if self.gossip is not None:
            self.gossip.link_up(link.peer_id)

    async def _watch_link(self, link: PeerLink) -> None:
        await link.wait_closed()
        if self.links.get(link.peer_id) is link:
            del self.links[link.peer_id]
            if self.gossip is not None and link.close_error is not None:
                self.gossip.link_down(link.peer_id)

    async def _on_inbound_link(self, link: PeerLink) -> None:
        self._adopt(link)
        await link.wait_closed()

    async def _dial_urls(self, urls, peer_id: str | None, timeout: float) -> PeerLink | None:
        with trio.move_on_after(timeout):
            for url in urls:
                try:
                    link = await self._nursery.start(partial(connect_link, url, self._link_settings(),
                                                             expected_peer_id=peer_id))
                except (MeshError, OSError) as exc:
                    log.debug("event=dial_failed url=%s error=%r", url, exc)
                    continue
                self._adopt(link)
                return self.links.get(link.peer_id, link)
        self.counters["dial_failures"] += 1
        return None

    async def link_to(self, peer_id: str) -> PeerLink:
        """The open link to ``peer_id``, dialling it (once, shared by concurrent callers) if needed."""
        link = self.links.get(peer_id)
        if link is not None and not link.closed:
            return link
        pending = self._dialing.get(peer_id)
        if pending is None:
            # Dial in the background: a handshake on a loaded machine can outlast the caller's
            # patience (gossip sends wait 1 s), and an abandoned dial would be wasted work.
            pending = self._dialing[peer_id] = trio.Event()
            self._nursery.start_soon(self._dial_peer, peer_id, pending)
        with trio.move_on_after(DIAL_TIMEOUT_S):
            await pending.wait()
        link = self.links.get(peer_id)
        if link is None or link.closed:
            raise LinkClosed(f"no link to peer {peer_id[:16]}", code="unreachable")
        return link

    async def _dial_peer(self, peer_id: str, done: trio.Event) -> None:
        try:
            # Any record, tombstones included: healing a partition means dialling peers we think are dead.
            rec = self.membership.record(peer_id) if self.membership else None
            ann = rec.announcement if rec is not None else None
            if ann is not None:
                await self._dial_urls([addr_to_url(a) for a in ann.addresses], peer_id, BACKGROUND_DIAL_TIMEOUT_S)
        finally:
            done.set()
            self._dialing.pop(peer_id, None)

    async def _send(self, peer_id: str, wire: dict) -> None:
        link = await self.link_to(peer_id)
        await link.send_message({"t": "gossip", "m": wire})

    async def _on_message(self, link: PeerLink, body: dict) -> None:
        if body.get("t") == "gossip" and isinstance(body.get("m"), dict):
            if self.gossip is not None:
                await self.gossip.deliver(link.peer_id, body["m"])
        else:
            self.counters["unknown_messages"] += 1
            log.warning("event=message_rejected peer=%s reason=unknown_type", link.peer_id[:16])

    # ---- membership ---------------------------------------------------------------------
    def _announcement(self) -> Announcement:
        node = self.node
        runners = list(node.local.runners.values())
        models = tuple(ModelEntry(r.model.id, r.state) for r in runners)
        tps = tuple((r.model.id, int(r.stats.tokens_per_s * 1000)) for r in runners if r.stats.tokens_per_s > 0)
        hw = node.hardware()
        return Announcement(
            node_id=self.node_id, incarnation=self.membership.incarnation if self.membership else self.incarnation,
            version=__version__, role=self.settings.role, addresses=tuple(self.addresses),
            api_port=node.api_server.port if node.api_server else None,
            console_port=node.console_server.port if node.console_server else None,
            models=models, hardware=Hardware(**hw), queue_depth=sum(r.queue_depth + r.in_flight for r in runners),
            throughput_milli=tps, rpc=self._rpc_capacity(), extra=self._extra())

    def _rpc_capacity(self):
        """Our RPC worker's capacity (hydra_node/runtime/hosting.py), None without a ready worker."""
        runtime = getattr(self.node, "runtime", None)
        return runtime.rpc_announcement()[0] if runtime is not None else None

    def _extra(self) -> dict:
        extra: dict = {}
        for source in self.extra_sources:
            extra.update(source())
        extra["name"] = self.node.config.name or self.node_id[:8]
        return extra

    async def _announce_loop(self) -> None:
        while True:
            ann = self._announcement()
            key = (ann.models, ann.queue_depth, ann.api_port, ann.console_port, ann.addresses,
                   ann.throughput_milli, ann.incarnation, ann.extra, ann.rpc)
            if key != self._last_ann:
                self._last_ann = key
                self.gossip.local_update(ann)  # the core stamps incarnation and seq, then re-signs
            await trio.sleep(ANNOUNCE_CHECK_S)

    @property
    def _known_peers_path(self) -> Path:
        return self.node.home / "mesh" / "peers.json"

    def _remember_peers(self) -> None:
        """Keep the addresses of current members, so a restart without --join finds the mesh again."""
        members = self.membership.members()
        known = {pid: list(ann.addresses) for pid, ann in members.items() if ann is not None and ann.addresses}
        if not known:
            return
        data = {"mesh_id": self.mesh.mesh_id,
                "peers": dict(sorted(known.items())[:MAX_REMEMBERED_PEERS])}
        if data == self._remembered:
            return  # announcements change often (queue depth); the file only when addresses do
        self._remembered = data
        tmp = self._known_peers_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._known_peers_path)

    async def _rejoin_known_peers(self) -> None:
        """After a restart without --join: dial the members we knew (best effort, in the background)."""
        try:
            data = json.loads(self._known_peers_path.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(data, dict) or data.get("mesh_id") != self.mesh.mesh_id:
            return
        seeds = []
        for pid, addrs in list((data.get("peers") or {}).items())[:MAX_REMEMBERED_PEERS]:
            if not isinstance(addrs, list):
                continue
            try:
                urls = [addr_to_url(str(a)) for a in addrs[:8]]
            except (TokenError, ValueError):
                continue
            link = await self._dial_urls(urls, pid, DIAL_TIMEOUT_S)
            if link is not None:
                seeds.append(pid)
        if seeds:
            log.info("event=mesh_rejoined_known_peers peers=%d", len(seeds))
            self.gossip.join(seeds)

    async def _consume_events(self) -> None:
        async for ev in self.gossip.events:
            if type(ev).__name__ in ("PeerJoined", "PeerUpdated"):
                self._remember_peers()
            log.info("event=membership_%s peer=%s incarnation=%s", type(ev).__name__.lower(),
                     ev.peer_id[:16], getattr(ev, "incarnation", ""))
            # Links are not closed on PeerDied: a dead peer's link dies by itself (reset or idle
            # timeout), and closing a link to a falsely suspected peer only slows its refutation.

    def peers(self) -> list[dict]:
        if self.membership is None:
            return []
        st = self.membership.statistics(trio.current_time())
        members = self.membership.members()
        out = []
        for p in st.peers:
            ann = members.get(p.peer_id)
            link = self.links.get(p.peer_id)
            out.append({"id": p.peer_id, "state": p.state, "role": p.role, "addresses": list(p.addresses),
                        "models": [m for m, _ in p.models], "model_states": dict(p.models),
                        "rtt_ms": None if link is None or link.rtt_ms is None else round(link.rtt_ms, 2),
                        "last_seen": None if p.last_seen_s is None else round(p.last_seen_s, 2),
                        "incarnation": p.incarnation, "api_port": ann.api_port if ann else None,
                        "queue_depth": ann.queue_depth if ann else None, "linked": link is not None})
        return out

    def token(self) -> str:
        now = time.time()
        if self._token is None or self._token[1] - now < TOKEN_REFRESH_MARGIN_S:
            self._token = (self.invite(self.settings.invite_ttl_s), now + self.settings.invite_ttl_s)
        return self._token[0]

    def invite(self, ttl_s: float) -> str:
        return issue_invite(self.identity.signing_key, self.mesh.mesh_id, self.addresses, ttl_s, time.time())

    def status(self) -> dict:
        links = {pid[:16]: l.statistics() for pid, l in self.links.items()}
        rejected: dict[str, int] = {}
        bytes_in = sum(s.bytes_in for s in links.values())
        bytes_out = sum(s.bytes_out for s in links.values())
        for s in links.values():
            for k, v in (getattr(s, "rejected", None) or {}).items():
                rejected[k] = rejected.get(k, 0) + v
        g = self.gossip.statistics() if self.gossip else None
        return {"mesh_id": self.mesh.mesh_id if self.mesh else None, "port": self.port, "addresses": self.addresses,
                "role": self.settings.role, "links": len(self.links), "frames_rejected": rejected,
                "link_bytes_in": bytes_in, "link_bytes_out": bytes_out,
                "handshake_failures": dict(self._listener.statistics().handshake_failures) if self._listener else {},
                "membership": None if g is None else {
                    "incarnation": g.membership.incarnation, "sent": g.membership.sent,
                    "received": g.membership.received, "rejected": g.membership.rejected,
                    "refutations": g.membership.refutations, "failed_sends": g.failed_sends,
                    "dropped_sends": g.dropped_sends},
                "counters": dict(self.counters)}

    # ---- routing: remote targets --------------------------------------------------------
    def targets(self) -> list[Target]:
        if self.membership is None:
            return []
        out = []
        states = {p.peer_id: p.state for p in self.membership.statistics(trio.current_time()).peers}
        for peer_id, ann in self.membership.members().items():
            if ann is None or ann.role == "client":
                continue
            link = self.links.get(peer_id)
            rtt = link.rtt_ms if link is not None and link.rtt_ms is not None else 1000.0
            for m in ann.models:
                state = m.state if states.get(peer_id) == "alive" else "suspect"
                out.append(Target(model=m.id, node_id=peer_id, local=False,
                                  open=partial(self.open_remote, peer_id), queue_depth=ann.queue_depth,
                                  rtt_ms=rtt, state=state))
        return out

    @asynccontextmanager
    async def open_remote(self, peer_id: str, req: GenerationRequest) -> AsyncIterator[AsyncIterator[GenerationEvent]]:
        """Run ``req`` on ``peer_id``: events stream back; leaving early resets the stream (cancels it there)."""
        try:
            link = await self.link_to(peer_id)
        except MeshError as exc:
            raise ModelUnavailable(f"peer {peer_id[:16]} is unreachable: {exc}") from None
        self.counters["remote_generations_opened"] += 1
        finished = False
        try:
            async with link.open_stream({"kind": "generate", "req": req.to_wire()}) as stream:

                async def events() -> AsyncIterator[GenerationEvent]:
                    nonlocal finished
                    decoder = FrameDecoder()
                    started = False
                    while True:
                        try:
                            data = await stream.receive()
                        except (StreamReset, LinkClosed) as exc:
                            raise GenerationError(f"peer {peer_id[:16]} lost: {exc}", code="peer_lost",
                                                  status=502, retryable=not started) from None
                        if not data:
                            raise GenerationError(f"peer {peer_id[:16]} ended the stream early", code="peer_lost",
                                                  status=502, retryable=not started)
                        decoder.receive_data(data)
                        while True:
                            try:
                                msg = decoder.next_message()
                            except ChannelError as exc:
                                raise GenerationError(f"peer {peer_id[:16]} sent a bad frame: {exc}",
                                                      code="bad_frame", status=502) from None
                            if msg is None:
                                break
                            ev = event_from_wire(msg.get("ev"))  # raises GenerationError for error events
                            started = True
                            yield ev
                            if getattr(ev, "type", "") == "finished":
                                finished = True
                                return

                try:
                    yield events()
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(STREAM_CLOSE_TIMEOUT_S):
                        if not finished:
                            await stream.reset("cancel", "requester gone")
                        else:  # read the host's end-of-stream so the stream closes cleanly
                            try:
                                while await stream.receive():
                                    pass
                            except (StreamReset, LinkClosed):
                                pass
        except (StreamReset, LinkClosed) as exc:
            if finished:
                return  # the answer is complete; a late close is not the client's problem
            self.counters["remote_generation_errors"] += 1
            raise GenerationError(f"peer {peer_id[:16]} lost: {exc}", code="peer_lost", status=502,
                                  retryable=True) from None

    # ---- serving streams for peers --------------------------------------------------------
    async def _on_stream(self, link: PeerLink, header: dict, stream: LinkStream) -> None:
        if self.membership is None or link.peer_id not in self.membership.members():
            # Quarantine: a peer gets no work done here before its first valid (signed) announcement.
            self.counters["quarantined_streams"] += 1
            await stream.reset("quarantined", "no valid announcement from this peer yet")
            return
        kind = header.get("kind")
        if kind == "generate":
            await self._serve_generate(link, header, stream)
        elif kind == "tunnel" and header.get("service") in self.tunnel_handlers:
            await self.tunnel_handlers[header["service"]](link, header, stream)
        else:
            self.counters["bad_stream_headers"] += 1
            log.warning("event=stream_rejected peer=%s kind=%r", link.peer_id[:16], kind)
            await stream.reset("refused", f"unknown stream kind {kind!r}")

    async def _serve_generate(self, link: PeerLink, header: dict, stream: LinkStream) -> None:
        async def send_error(err: GenerationError) -> None:
            await stream.send(encode_frame({"op": "event", "ev": {"type": "error", **err.to_wire()}}))
            await stream.send_eof()

        try:
            req = GenerationRequest.from_wire(header.get("req"))
        except InvalidRequest as exc:
            self.counters["bad_stream_headers"] += 1
            await send_error(GenerationError(f"invalid request: {exc.message}", code="invalid_request", status=400))
            return
        runner = self.node.local.runners.get(req.model)
        if runner is None:
            await send_error(ModelUnavailable(f"peer {self.node_id[:16]} does not host {req.model!r}"))
            return
        self.counters["remote_generations_served"] += 1
        gone = False
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                nonlocal gone
                try:
                    while await stream.receive():
                        pass
                except (StreamReset, LinkClosed):
                    gone = True
                    nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            try:
                async with runner.generate(req) as events:
                    async for ev in events:
                        await stream.send(encode_frame({"op": "event", "ev": ev.to_wire()}))
                await stream.send_eof()
            except GenerationError as exc:
                try:
                    await send_error(exc)
                except (StreamReset, LinkClosed):
                    pass
            except (StreamReset, LinkClosed):
                gone = True
            nursery.cancel_scope.cancel()
        if gone:
            log.info("event=remote_generation_cancelled peer=%s model=%s", link.peer_id[:16], req.model)
