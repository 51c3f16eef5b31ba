"""DiscoveryService against a fake mesh (its public surface only): the --auto join order, the
fallback to our own mesh, the advert and listing it builds, and `discover`'s error reporting."""

from __future__ import annotations

import secrets
import time

import nacl.signing

from hydra_node.discovery.adverts import advert_ips, listing_content, mdns_advert
from hydra_node.cli.discovery import os_errors
from hydra_node.discovery.node_choice import (
    CandidateSet,
    DiscoverySettings,
    JoinCandidate,
    lan_fingerprint,
    load_last_mesh,
)
from hydra_node.discovery.service import DiscoveryPhase, DiscoveryService, NodeFacts
from hydra_node.mesh.wire.ids import MeshSecret
from hydra_node.mesh.joining import JoinFailed, JoinPlan
from hydra_node.mesh.wire.token import issue_invite, parse_invite
from hydra_node.mesh.status_view import PeerRow

NODE = secrets.token_hex(32)


def _row(peer_id: str, state: str, role: str) -> PeerRow:
    return PeerRow(
        id=peer_id,
        state=state,
        role=role,
        addresses=(),
        models=(),
        model_states={},
        rtt_ms=None,
        last_seen=None,
        incarnation=1,
        api_port=None,
        queue_depth=None,
        linked=state == "alive",
    )


class FakeMesh:
    """The mesh service's public surface, recording the plans it is asked to join."""

    def __init__(self, *, refuse: int = 0, unreachable_members: bool = False) -> None:
        self.plans: list[JoinPlan] = []
        self.refuse = refuse  # this many token plans fail
        self.unreachable_members = unreachable_members
        self.secret: MeshSecret | None = None
        self.port: int | None = None
        self.addresses: list[str] = []
        self.invite_ttl_s = 3600.0
        self.key = nacl.signing.SigningKey.generate()

    @property
    def mesh_id(self) -> str | None:
        return self.secret.mesh_id if self.secret else None

    @property
    def mesh_secret(self) -> MeshSecret | None:
        return self.secret

    async def join(self, plan: JoinPlan) -> tuple[str, ...]:
        self.plans.append(plan)
        if plan.invites and self.refuse:
            self.refuse -= 1
            raise JoinFailed("refused")
        if self.secret is None:
            self.secret, self.port, self.addresses = MeshSecret.generate(), 4000, ["10.1.2.3:4000", "127.0.0.1:4000"]
        if plan.members and self.unreachable_members:
            return ()
        return tuple(c.peer_id for c in plan.members) or tuple(t.issuer_id for t in plan.invites)

    def peers(self) -> list[PeerRow]:
        return [_row("p1", "alive", "client"), _row("p2", "alive", "host"), _row("p3", "dead", "host")]

    def token(self) -> str | None:
        return self.invite(self.invite_ttl_s) if self.secret else None

    def invite(self, ttl_s: float) -> str:
        return issue_invite(self.key, self.mesh_id, self.addresses, ttl_s, time.time())


def facts() -> NodeFacts:
    return NodeFacts(
        node_id=NODE,
        name="al|pha",
        configured_models=frozenset({"m"}),
        ready_models=lambda: ["m", "a"],
        serving_models=lambda: ["m", "a", "p"],
        spare_slots=lambda: 3,
    )


def token(mesh_id: str | None = None) -> str:
    return issue_invite(
        nacl.signing.SigningKey.generate(), mesh_id or MeshSecret.generate().mesh_id, ["127.0.0.1:1"], 3600, time.time()
    )


def service(mesh: FakeMesh, tmp_path, lan=(), nostr=(), **settings) -> DiscoveryService:
    s = DiscoveryService(
        mesh, facts(), DiscoverySettings(auto=True, mdns=False, mode="nostr", **settings), home=tmp_path
    )

    async def scan(held, last):
        return CandidateSet(tuple(lan)), CandidateSet(tuple(nostr))

    s._scan = scan  # the browsing itself is tested with real mDNS and relays elsewhere
    return s


async def test_auto_tries_tokens_in_order_then_remembers_the_mesh(tmp_path):
    mesh = FakeMesh(refuse=1)
    cands = [JoinCandidate("nostr", "a" * 32, token=token()), JoinCandidate("nostr", "b" * 32, token=token())]
    s = service(mesh, tmp_path, nostr=cands)
    assert s.phase is DiscoveryPhase.IDLE
    assert await s._auto_join() == cands[1].token
    assert [p.invites[0].text for p in mesh.plans] == [cands[0].token, cands[1].token]
    assert all(p.admission_timeout_s == s.settings.join_attempt_s for p in mesh.plans)
    assert s.auto["outcome"] == "joined" and s.auto["attempts"][0]["error"] == "refused"
    assert s.phase is DiscoveryPhase.JOINING and s.status()["phase"] == "joining"


async def test_auto_creates_a_mesh_when_every_candidate_fails(tmp_path):
    mesh = FakeMesh(refuse=9)
    s = service(mesh, tmp_path, nostr=[JoinCandidate("nostr", "a" * 32, token=token())])
    assert await s._auto_join() is None
    assert mesh.plans[-1] == JoinPlan() and s.auto["outcome"] == "created_after_failures"
    assert s.auto["mesh_id"] == mesh.mesh_id


async def test_auto_resumes_as_a_member_before_any_token(tmp_path):
    mesh = FakeMesh(unreachable_members=True)
    members = [
        JoinCandidate("lan", "a" * 32, urls=("ws://10.0.0.1:1",), peer_id="1" * 64),
        JoinCandidate("lan", "a" * 32, urls=("ws://10.0.0.2:1",), peer_id="2" * 64),
    ]
    s = service(mesh, tmp_path, lan=members, nostr=[JoinCandidate("nostr", "b" * 32, token=token())])
    assert await s._auto_join() is None
    assert [p.members[0].peer_id for p in mesh.plans] == ["1" * 64, "2" * 64]  # never the token
    assert s.auto["outcome"] == "resumed" and len(s.auto["attempts"]) == 2


async def test_run_joins_the_roots_plan_and_remembers_it(tmp_path, nursery):
    mesh = FakeMesh()
    tok = token()
    plan = JoinPlan(invites=(parse_invite(tok, time.time()),))
    s = DiscoveryService(mesh, facts(), DiscoverySettings(mdns=False, mode="nostr"), home=tmp_path, plan=plan)
    await nursery.start(s.run)
    assert mesh.plans == [plan] and s.phase is DiscoveryPhase.READY
    last = load_last_mesh(tmp_path)
    assert last.mesh_id == mesh.mesh_id and last.token == tok


def test_advert_is_built_from_the_mesh_surface():
    mesh = FakeMesh()
    mesh.secret, mesh.port, mesh.addresses = MeshSecret.generate(), 4000, ["10.1.2.3:4000", "127.0.0.1:4000"]
    ad = mdns_advert(
        mesh, node_id=NODE, name="al|pha", ready_models=["m", "a"], alive_peers=2, fallback_ip="0.0.0.0", origin=None
    )
    assert ad.addresses == ("10.1.2.3",) and ad.port == 4000 and ad.name == "alpha" and ad.models == ("a", "m")
    assert ad.token_fingerprint == lan_fingerprint(mesh.secret) and ad.node_count == 3
    assert advert_ips(["ws://127.0.0.1:1"], "0.0.0.0") == ["127.0.0.1"]
    assert advert_ips(["[::1]:1"], "192.168.1.5") == ["192.168.1.5"]


def test_listing_carries_a_fresh_invite_for_our_mesh():
    mesh = FakeMesh()
    mesh.secret, mesh.port, mesh.addresses = MeshSecret.generate(), 4000, ["10.1.2.3:4000"]
    content = listing_content(
        mesh,
        DiscoverySettings(mesh_name="home", max_clients=5),
        peers=mesh.peers()[:2],
        serving=["m", "bad\nname", "m", "x" * 200],
        spare_slots=3,
    )
    assert content.mesh_id == mesh.mesh_id and parse_invite(content.invite_token, time.time()).mesh_id == mesh.mesh_id
    assert content.serving == ("m",) and content.node_count == 3 and content.client_count == 1
    assert (content.name, content.max_clients, content.spare_slots) == ("home", 5, 3)


def test_discover_reports_every_os_error_of_a_group():
    a, b = OSError("no multicast route"), OSError("relay refused")
    assert os_errors(a) == [a]
    assert os_errors(ExceptionGroup("x", [a, ExceptionGroup("y", [b])])) == [a, b]
    assert os_errors(ExceptionGroup("x", [a, ValueError("bug")])) is None
    assert os_errors(ValueError("bug")) is None
