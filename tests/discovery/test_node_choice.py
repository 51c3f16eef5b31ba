"""The pure part of serve's discovery: LAN fingerprint, who may join what, the join plan, the last-mesh file."""

from __future__ import annotations

import hashlib
import json
import secrets
import time

import nacl.signing
import pytest

from hydra_node.discovery.auto import AutoContext, rank_listings
from hydra_node.discovery.mdns.wire import MdnsAdvert
from hydra_node.discovery.node_choice import (
    CandidateSet,
    DiscoverySettings,
    DiscoverySettingsError,
    HeldCredentials,
    LastMesh,
    held_credentials,
    ordered_candidates,
    lan_candidates,
    lan_fingerprint,
    last_mesh_path,
    load_last_mesh,
    nostr_candidates,
    probe_address,
    save_last_mesh,
)
from hydra_node.discovery.nostr.events import Listing, ListingContent
from hydra_node.mesh.wire.ids import MeshSecret, node_id_from_public_key
from hydra_node.mesh.wire.token import issue_invite, parse_invite

NOW = time.time()
ME = secrets.token_hex(32)


def node_key():
    key = nacl.signing.SigningKey.generate()
    return key, node_id_from_public_key(bytes(key.verify_key))


def advert(
    mesh: MeshSecret | None = None,
    *,
    mesh_id: str | None = None,
    fp: str | None = None,
    node_id: str | None = None,
    nodes: int = 1,
    port: int = 4000,
) -> MdnsAdvert:
    node_id = node_id or secrets.token_hex(32)
    mesh_id = mesh_id or mesh.mesh_id
    return MdnsAdvert(
        instance=f"hydra-{node_id[:12]}",
        port=port,
        addresses=("127.0.0.1",),
        node_id=node_id,
        mesh_id=mesh_id,
        token_fingerprint=fp or (lan_fingerprint(mesh) if mesh else "0" * 32),
        name="n",
        models=(),
        node_count=nodes,
        version="0.1.0",
        origin=secrets.token_hex(8),
    )


def test_fingerprint_is_keyed_by_the_mesh_key():
    m1, m2 = MeshSecret.generate(), MeshSecret.generate()
    fp = lan_fingerprint(m1)
    assert len(fp) == 32 and int(fp, 16) >= 0
    assert fp == lan_fingerprint(MeshSecret(m1.mesh_key)) != lan_fingerprint(m2)


def test_member_joins_only_its_mesh_with_a_matching_fingerprint():
    mine, other = MeshSecret.generate(), MeshSecret.generate()
    good = advert(mine, nodes=3)
    forged = advert(mesh_id=mine.mesh_id, fp=lan_fingerprint(other))  # right id, fingerprint not ours
    stranger = advert(other)
    res = lan_candidates([forged, stranger, good], HeldCredentials(mesh=mine), node_id=ME)
    assert [c.peer_id for c in res.candidates] == [good.node_id]
    c = res.candidates[0]
    assert c.token is None and c.urls == (f"ws://127.0.0.1:{good.port}",)
    assert sorted(s.reason for s in res.skipped) == ["fingerprint_mismatch", "no_credential"]


def test_token_holder_joins_only_the_advertised_mesh_of_its_token():
    key, issuer = node_key()
    target, other = MeshSecret.generate(), MeshSecret.generate()
    tok = parse_invite(issue_invite(key, target.mesh_id, ["127.0.0.1:1"], 3600, NOW), NOW)
    # the token holder cannot check the fingerprint: the mesh id decides
    res = lan_candidates([advert(target, fp="1" * 32), advert(other)], HeldCredentials(tokens=(tok,)), node_id=ME)
    assert [(c.mesh_id, c.token, c.peer_id) for c in res.candidates] == [(target.mesh_id, tok.text, issuer)]
    assert [s.reason for s in res.skipped] == ["no_credential"]


def test_no_credential_never_a_candidate_and_own_advert_skipped():
    m = MeshSecret.generate()
    res = lan_candidates([advert(m), advert(m, node_id=ME)], HeldCredentials(), node_id=ME)
    assert res.candidates == ()
    assert sorted(s.reason for s in res.skipped) == ["no_credential", "self"]


def test_lan_order_last_mesh_then_bigger():
    a, b = MeshSecret.generate(), MeshSecret.generate()
    key, _ = node_key()
    tok_b = parse_invite(issue_invite(key, b.mesh_id, ["127.0.0.1:1"], 3600, NOW), NOW)
    held = HeldCredentials(mesh=a, tokens=(tok_b,))
    small, big, last = advert(a, nodes=1), advert(a, nodes=5), advert(b, nodes=1)
    res = lan_candidates([small, big, last], held, node_id=ME, last_mesh_id=b.mesh_id)
    assert [c.label.split("@")[0] for c in res.candidates] == ["n"] * 3
    assert [c.mesh_id for c in res.candidates] == [b.mesh_id, a.mesh_id, a.mesh_id]
    assert res.candidates[1].peer_id == big.node_id


def listing(token: str, mesh_id: str, *, pubkey: str = "ab", nodes: int = 1) -> Listing:
    c = ListingContent(mesh_id=mesh_id, invite_token=token, node_count=nodes)
    eid = hashlib.sha256(f"{pubkey}{token}".encode()).hexdigest()
    return Listing(
        pubkey=pubkey * 32, d=c.d_tag, event_id=eid, created_at=int(NOW), expires_at=int(NOW) + 120, content=c
    )


def test_nostr_candidates_drop_unusable_tokens_and_our_own():
    key, issuer = node_key()
    m1, m2 = MeshSecret.generate(), MeshSecret.generate()
    good = listing(issue_invite(key, m1.mesh_id, ["127.0.0.1:9"], 3600, NOW), m1.mesh_id, pubkey="01", nodes=3)
    mismatch = listing(issue_invite(key, m1.mesh_id, ["127.0.0.1:9"], 3600, NOW), m2.mesh_id, pubkey="02")
    expired = listing(issue_invite(key, m2.mesh_id, ["127.0.0.1:9"], 10, NOW - 100), m2.mesh_id, pubkey="03")
    junk = listing("not-a-token", m2.mesh_id, pubkey="04")
    ranked = rank_listings([good, mismatch, expired, junk], AutoContext(now=int(NOW)))
    res = nostr_candidates(ranked, node_id=ME, now=NOW)
    assert [(c.mesh_id, c.peer_id, c.source) for c in res.candidates] == [(m1.mesh_id, issuer, "nostr")]
    reasons = sorted(s.reason for s in res.skipped)
    assert reasons[-1] == "token_mesh_mismatch" and all(r.startswith("bad_token:") for r in reasons[:2])
    own = nostr_candidates(ranked, node_id=issuer, now=NOW)
    assert own.candidates == () and "own_listing" in {s.reason for s in own.skipped}


def test_plan_puts_lan_first_and_is_bounded():
    lan = lan_candidates([advert(m := MeshSecret.generate())], HeldCredentials(mesh=m), node_id=ME)
    key, _ = node_key()
    ls = [
        listing(issue_invite(key, x.mesh_id, ["127.0.0.1:9"], 3600, NOW), x.mesh_id, pubkey=f"{i:02x}")
        for i, x in enumerate(MeshSecret.generate() for _ in range(5))
    ]
    nostr = nostr_candidates(rank_listings(ls, AutoContext(now=int(NOW))), node_id=ME, now=NOW)
    plan = ordered_candidates(lan, nostr, limit=4)
    assert [c.source for c in plan] == ["lan", "nostr", "nostr", "nostr"]
    assert ordered_candidates(CandidateSet(()), CandidateSet(())) == ()


def test_probe_address():
    key, _ = node_key()
    m = MeshSecret.generate()
    assert probe_address(issue_invite(key, m.mesh_id, ["10.0.0.2:9338"], 60, NOW), NOW) == ("10.0.0.2", 9338)
    assert probe_address(issue_invite(key, m.mesh_id, ["ws://h.example:7"], 60, NOW), NOW) == ("h.example", 7)
    assert probe_address("junk", NOW) is None


def test_last_mesh_roundtrip_and_bad_files(tmp_path):
    m = MeshSecret.generate()
    assert load_last_mesh(tmp_path) is None
    save_last_mesh(tmp_path, LastMesh(m.mesh_id, 5.0, "tok"))
    assert load_last_mesh(tmp_path) == LastMesh(m.mesh_id, 5.0, "tok")
    assert last_mesh_path(tmp_path).stat().st_mode & 0o077 == 0
    for junk in (
        b"{",
        b"[]",
        json.dumps({"mesh_id": "not hex"}).encode(),
        b"x" * 10_000,
        json.dumps({"mesh_id": m.mesh_id, "token": 5}).encode(),
    ):
        last_mesh_path(tmp_path).write_bytes(junk)
        assert load_last_mesh(tmp_path) is None


def test_held_credentials_keep_only_usable_tokens():
    key, _ = node_key()
    m = MeshSecret.generate()
    live = issue_invite(key, m.mesh_id, ["127.0.0.1:1"], 3600, NOW)
    dead = issue_invite(key, m.mesh_id, ["127.0.0.1:1"], 10, NOW - 100)
    assert held_credentials(None, LastMesh(m.mesh_id, 0, live), NOW).token_for(m.mesh_id).text == live
    assert held_credentials(None, LastMesh(m.mesh_id, 0, dead), NOW).tokens == ()
    assert held_credentials(m, None, NOW).mesh is m


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(mode="lan"), "mesh-discovery-mode"),
        (dict(mode="mdns", publish=True), "--publish needs Nostr"),
        (dict(mode="nostr", mdns=True), "--mdns needs"),
        (dict(mdns_port=0), "--mdns-port"),
        (dict(mdns_group="10.1.2.3"), "not an IPv4 multicast"),
        (dict(mdns_interface="eth0"), "--mdns-interface"),
        (dict(relays=("http://x",)), "--nostr-relay"),
        (dict(mesh_name=""), "--mesh-name"),
        (dict(max_clients=-1), "--max-clients"),
        (dict(auto_wait_s=0), "--auto-wait"),
        (dict(auto=True, mode="mdns", mdns=False), "no source left"),
    ],
)
def test_settings_validation(kw, msg):
    with pytest.raises(DiscoverySettingsError, match=msg):
        DiscoverySettings(**kw).validate()


def test_mdns_default_is_on_only_with_auto():
    assert not DiscoverySettings().use_mdns and not DiscoverySettings().active
    assert DiscoverySettings(auto=True).use_mdns
    assert not DiscoverySettings(auto=True, mode="nostr").use_mdns
    assert not DiscoverySettings(auto=True, mdns=False).use_mdns
    assert DiscoverySettings(mdns=True).use_mdns
    assert DiscoverySettings(publish=True).active and not DiscoverySettings(publish=True).use_nostr_discovery
