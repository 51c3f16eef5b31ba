"""What ``serve`` does with discovery (pure): settings, the LAN fingerprint, and which mesh ``--auto`` joins.

* :class:`DiscoverySettings` is what the command line asked for (checked by ``validate``).
* :func:`lan_fingerprint` is the ``tok_fp`` a member puts in its mDNS TXT record: a MAC of
  the mesh id under the mesh key, so only members can make or check it.
* :func:`lan_candidates` turns mDNS adverts into join candidates, **only** for meshes we hold a
  credential for (our mesh key, whose fingerprint must then match; or a remembered invite token
  for that mesh id).  A node with no credential for an advertised mesh never tries to join it.
* :func:`nostr_candidates` turns ranked Nostr listings into candidates (their invite token is
  public by design), dropping listings whose token is unusable or was issued by ourselves.
* :func:`ordered_candidates` orders them: LAN first (local, and we hold a credential), then Nostr in
  ``rank_listings`` order, at most ``MAX_JOIN_ATTEMPTS``.

The last mesh a node was in is remembered in ``HOME/discovery/last_mesh.json`` (0600) for the
``sticky`` bonus of :mod:`auto` and the LAN order.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from hydra_node.discovery.auto import ListingScore
from hydra_node.discovery.mdns.service import MDNS_GROUP, MDNS_PORT
from hydra_node.discovery.mdns.wire import MdnsAdvert
from hydra_node.discovery.nostr.relay import validate_relay_url
from hydra_node.discovery.snapshot import discovery_sources
from hydra_node.mesh.wire.errors import TokenError
from hydra_node.mesh.wire.ids import MeshSecret, is_mesh_id
from hydra_node.mesh.wire.token import InviteToken, parse_invite

DISCOVERY_MODES = ("mdns", "nostr", "both")
LAN_FINGERPRINT_LABEL = b"hydra-lan-fingerprint-v1"
LAN_FINGERPRINT_BYTES = 16  # 32 hex characters, the TXT `tok_fp` format
AUTO_WAIT_S = 5.0  # --auto: longest wait for discovery before deciding (returns early when synced)
AUTO_JOIN_ATTEMPT_S = 4.0  # --auto: bound on one join attempt (a first try of every address, then retries)
MAX_JOIN_ATTEMPTS = 4  # --auto: candidates tried before starting a new mesh
MAX_LAST_MESH_BYTES = 8192  # the last-mesh file is ours, but never read an unbounded file
LAST_MESH_FILE = ("discovery", "last_mesh.json")


class DiscoverySettingsError(ValueError):
    """A discovery flag is invalid (the CLI reports it as a configuration error)."""


@dataclass(frozen=True)
class DiscoverySettings:
    mode: str = "both"  # --mesh-discovery-mode: which sources may be used at all
    mdns: bool | None = None  # --mdns / --no-mdns; None = on with --auto (LAN in mode), else off
    mdns_group: str = MDNS_GROUP
    mdns_port: int = MDNS_PORT
    mdns_interface: str = "0.0.0.0"
    auto: bool = False  # --auto: discover and join the best mesh, else start one
    publish: bool = False  # --publish: list our mesh on Nostr
    relays: tuple[str, ...] = ()  # --nostr-relay; empty = the public defaults
    mesh_name: str | None = None  # --mesh-name: published name; only that name is auto-joined
    region: str | None = None  # --region: published, free-form
    max_clients: int = 0  # --max-clients: published; 0 = unlimited
    auto_wait_s: float = AUTO_WAIT_S
    join_attempt_s: float = AUTO_JOIN_ATTEMPT_S
    publish_interval_s: float = 60.0
    listing_ttl_s: int = 120

    def validate(self) -> None:
        if self.mode not in DISCOVERY_MODES:
            raise DiscoverySettingsError(f"--mesh-discovery-mode: must be mdns, nostr or both, not {self.mode!r}")
        lan, nostr = discovery_sources(self.mode)
        if self.publish and not nostr:
            raise DiscoverySettingsError("--publish needs Nostr: use --mesh-discovery-mode nostr or both")
        if self.mdns and not lan:
            raise DiscoverySettingsError("--mdns needs the LAN source: use --mesh-discovery-mode mdns or both")
        if self.auto and not (self.use_mdns or self.use_nostr_discovery):
            raise DiscoverySettingsError("--auto has no source left: --no-mdns with --mesh-discovery-mode mdns")
        try:
            if not ipaddress.IPv4Address(self.mdns_group).is_multicast:
                raise DiscoverySettingsError(f"--mdns-group: {self.mdns_group} is not an IPv4 multicast address")
            ipaddress.IPv4Address(self.mdns_interface)
        except ipaddress.AddressValueError as exc:
            raise DiscoverySettingsError(f"--mdns-group/--mdns-interface: {exc}") from None
        if not 0 < self.mdns_port < 65536:
            raise DiscoverySettingsError(f"--mdns-port: must be a UDP port, not {self.mdns_port}")
        for url in self.relays:
            try:
                validate_relay_url(url)
            except ValueError as exc:
                raise DiscoverySettingsError(f"--nostr-relay: {exc}") from None
        if self.mesh_name is not None and not (0 < len(self.mesh_name) <= 64 and self.mesh_name.isprintable()):
            raise DiscoverySettingsError("--mesh-name: 1..64 printable characters")
        if self.region is not None and not (0 < len(self.region) <= 64 and self.region.isprintable()):
            raise DiscoverySettingsError("--region: 1..64 printable characters")
        if not 0 <= self.max_clients <= 1_000_000:
            raise DiscoverySettingsError("--max-clients: 0..1000000 (0 = unlimited)")
        if not 0 < self.auto_wait_s <= 600:
            raise DiscoverySettingsError("--auto-wait: 0 < seconds <= 600")

    @property
    def use_mdns(self) -> bool:
        lan, _ = discovery_sources(self.mode)
        return lan and (self.mdns if self.mdns is not None else self.auto)

    @property
    def use_nostr_discovery(self) -> bool:
        return self.auto and discovery_sources(self.mode)[1]

    @property
    def active(self) -> bool:
        return self.use_mdns or self.use_nostr_discovery or self.publish


def lan_fingerprint(mesh: MeshSecret) -> str:
    """``tok_fp`` for our mDNS advert: only holders of the mesh key can make or check it."""
    return mesh.mac(LAN_FINGERPRINT_LABEL, mesh.mesh_id.encode())[:LAN_FINGERPRINT_BYTES].hex()


def lan_fingerprint_matches(mesh: MeshSecret, advert: MdnsAdvert) -> bool:
    return advert.mesh_id == mesh.mesh_id and hmac.compare_digest(lan_fingerprint(mesh), advert.token_fingerprint)


@dataclass(frozen=True)
class HeldCredentials:
    """What lets this node into a mesh found on the LAN."""

    mesh: MeshSecret | None = None  # our mesh key (HOME/mesh/mesh.key): we are a member
    tokens: tuple[InviteToken, ...] = ()  # unexpired invite tokens we hold (remembered from the last join)

    def token_for(self, mesh_id: str) -> InviteToken | None:
        return next((t for t in self.tokens if t.mesh_id == mesh_id), None)


@dataclass(frozen=True)
class JoinCandidate:
    """One way into one mesh: an invite token (``token``), or a member dial (``urls`` of ``peer_id``)."""

    source: str  # "lan" | "nostr"
    mesh_id: str
    token: str | None = None
    urls: tuple[str, ...] = ()
    peer_id: str | None = None
    score: float = 0.0
    label: str = ""

    def describe(self) -> dict:
        return {
            "source": self.source,
            "mesh_id": self.mesh_id,
            "via": "token" if self.token else "member",
            "peer_id": self.peer_id,
            "score": self.score,
            "label": self.label,
        }


@dataclass(frozen=True)
class Skipped:
    source: str
    label: str
    reason: str


@dataclass(frozen=True)
class CandidateSet:
    candidates: tuple[JoinCandidate, ...]
    skipped: tuple[Skipped, ...] = field(default=())


def lan_candidates(
    adverts: Iterable[MdnsAdvert], held: HeldCredentials, *, node_id: str, last_mesh_id: str | None = None
) -> CandidateSet:
    """Adverts of meshes we hold a credential for; everything else is skipped with its reason."""
    out: list[tuple[tuple, JoinCandidate]] = []
    skipped: list[Skipped] = []
    for a in adverts:
        label = f"{a.name or a.instance}@{','.join(a.addresses)}:{a.port}"
        if a.node_id == node_id:
            skipped.append(Skipped("lan", label, "self"))
            continue
        if held.mesh is not None and a.mesh_id == held.mesh.mesh_id:
            if not lan_fingerprint_matches(held.mesh, a):
                skipped.append(Skipped("lan", label, "fingerprint_mismatch"))
                continue
            cand = JoinCandidate(
                "lan",
                a.mesh_id,
                urls=tuple(f"ws://{ip}:{a.port}" for ip in a.addresses),
                peer_id=a.node_id,
                label=label,
            )
        elif (tok := held.token_for(a.mesh_id)) is not None:
            # A token holder cannot check the fingerprint (it does not know the mesh key); the
            # handshake with the token's issuer is the admission.
            cand = JoinCandidate("lan", a.mesh_id, token=tok.text, peer_id=tok.issuer_id, label=label)
        else:
            skipped.append(Skipped("lan", label, "no_credential"))
            continue
        order = (0 if a.mesh_id == last_mesh_id else 1, -a.node_count, a.instance)
        out.append((order, cand))
    out.sort(key=lambda x: x[0])
    return CandidateSet(tuple(c for _, c in out), tuple(skipped))


def nostr_candidates(ranked: Sequence[ListingScore], *, node_id: str, now: float) -> CandidateSet:
    """Ranked listings (``rank_listings`` order) whose invite token is usable and not our own."""
    out: list[JoinCandidate] = []
    skipped: list[Skipped] = []
    for s in ranked:
        c = s.listing.content
        label = f"{c.name or c.mesh_id} ({s.listing.pubkey[:12]})"
        try:
            tok = parse_invite(c.invite_token, now)
        except TokenError as exc:
            skipped.append(Skipped("nostr", label, f"bad_token:{getattr(exc, 'code', type(exc).__name__)}"))
            continue
        if tok.mesh_id != c.mesh_id:
            skipped.append(Skipped("nostr", label, "token_mesh_mismatch"))
            continue
        if tok.issuer_id == node_id:
            skipped.append(Skipped("nostr", label, "own_listing"))
            continue
        out.append(JoinCandidate("nostr", c.mesh_id, token=tok.text, peer_id=tok.issuer_id, score=s.total, label=label))
    return CandidateSet(tuple(out), tuple(skipped))


def ordered_candidates(
    lan: CandidateSet, nostr: CandidateSet, limit: int = MAX_JOIN_ATTEMPTS
) -> tuple[JoinCandidate, ...]:
    """LAN candidates first (we hold their credential, and they are near), then Nostr ones; at most ``limit``."""
    return (lan.candidates + nostr.candidates)[:limit]


def probe_address(token_text: str, now: float) -> tuple[str, int] | None:
    """(host, port) of the first address of an invite token, for an RTT probe; None if unusable."""
    try:
        tok = parse_invite(token_text, now)
    except TokenError:
        return None
    addr = tok.addrs[0]
    hostport = addr.split("://", 1)[-1].split("/", 1)[0]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


# ---- the last mesh joined (HOME/discovery/last_mesh.json) -------------------------------------


@dataclass(frozen=True)
class LastMesh:
    mesh_id: str
    at: float
    token: str | None = None  # the invite token used to join it (a bearer credential: the file is 0600)


def last_mesh_path(home: Path) -> Path:
    return home.joinpath(*LAST_MESH_FILE)


def load_last_mesh(home: Path) -> LastMesh | None:
    """The remembered mesh, or None when missing or unreadable (it is only a scoring hint)."""
    path = last_mesh_path(home)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LAST_MESH_BYTES + 1)
        if len(raw) > MAX_LAST_MESH_BYTES:
            return None
        d = json.loads(raw)
        mesh_id, at, token = d["mesh_id"], float(d.get("at", 0)), d.get("token")
        if not is_mesh_id(mesh_id) or (token is not None and not isinstance(token, str)):
            return None
        return LastMesh(mesh_id, at, token)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save_last_mesh(home: Path, last: LastMesh) -> None:
    path = last_mesh_path(home)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"mesh_id": last.mesh_id, "at": last.at, "token": last.token}, f)
    os.replace(tmp, path)


def held_credentials(mesh: MeshSecret | None, last: LastMesh | None, now: float) -> HeldCredentials:
    tokens: list[InviteToken] = []
    if last is not None and last.token:
        try:
            tokens.append(parse_invite(last.token, now))
        except TokenError:
            pass  # expired or unreadable: nothing held
    return HeldCredentials(mesh, tuple(tokens))
