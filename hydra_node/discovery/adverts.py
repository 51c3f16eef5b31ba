"""What this node says about its mesh on the LAN (mDNS advert) and on Nostr (listing content) — pure.

Both are built from the mesh service's public surface and a few facts the root supplies; they are
rebuilt when the node count or the models change (:class:`~hydra_node.discovery.service.DiscoveryService`).
"""

from __future__ import annotations

import ipaddress
import secrets
from typing import Protocol

from hydra_node import __version__
from hydra_node.discovery.mdns.wire import MAX_ADDRESSES, MAX_MODELS, MdnsAdvert, MdnsAdvertError
from hydra_node.discovery.node_choice import DiscoverySettings, lan_fingerprint
from hydra_node.discovery.nostr.events import ListingContent
from hydra_node.mesh.wire.ids import MeshSecret
from hydra_node.mesh.status_view import PeerRow

__all__ = ["MAX_LISTED_MODELS", "MAX_MODEL_NAME", "advert_ips", "listing_content", "mdns_advert"]

MAX_LISTED_MODELS = 32  # ListingContent bound
MAX_MODEL_NAME = 128
MAX_NAME_CHARS = 64  # the advert's name field
MAX_NODE_COUNT = 100_000  # advert bound
MAX_LISTING_COUNT = 1_000_000  # listing bound on node/client counts and spare slots


class AdvertisedMesh(Protocol):
    @property
    def port(self) -> int | None: ...
    @property
    def addresses(self) -> list[str]: ...
    @property
    def mesh_id(self) -> str | None: ...
    @property
    def mesh_secret(self) -> MeshSecret | None: ...
    def token(self) -> str | None: ...


def advert_ips(addresses: list[str], fallback: str) -> list[str]:
    """The IPv4 hosts of our link addresses, loopback only when it is all we have."""
    ips: list[str] = []
    for addr in addresses:
        host = addr.split("://", 1)[-1].rsplit(":", 1)[0]
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            continue
        if host not in ips:
            ips.append(host)
    if any(not ip.startswith("127.") for ip in ips):
        ips = [ip for ip in ips if not ip.startswith("127.")]
    return ips or [fallback if fallback != "0.0.0.0" else "127.0.0.1"]


def mdns_advert(
    mesh: AdvertisedMesh,
    *,
    node_id: str,
    name: str,
    ready_models: list[str],
    alive_peers: int,
    fallback_ip: str,
    origin: str | None,
) -> MdnsAdvert:
    """Our advert; models are dropped from the end while the TXT record is too long."""
    secret = mesh.mesh_secret
    if secret is None or mesh.port is None:
        raise MdnsAdvertError("not in a mesh yet: nothing to advertise")
    ips = advert_ips(mesh.addresses, fallback_ip)
    clean_name = "".join(ch for ch in name if ch.isprintable() and ch != "|")[:MAX_NAME_CHARS]
    models = sorted(ready_models)[:MAX_MODELS]
    while True:
        try:
            return MdnsAdvert(
                instance=f"hydra-{node_id[:12]}",
                port=mesh.port,
                addresses=tuple(ips[:MAX_ADDRESSES]),
                node_id=node_id,
                mesh_id=secret.mesh_id,
                token_fingerprint=lan_fingerprint(secret),
                name=clean_name,
                models=tuple(models),
                node_count=min(1 + alive_peers, MAX_NODE_COUNT),
                version=__version__,
                origin=origin or secrets.token_hex(8),
            )
        except MdnsAdvertError:
            if not models:
                raise
            models = models[:-1]  # the TXT string is full: list fewer models


def listing_content(
    mesh: AdvertisedMesh, settings: DiscoverySettings, *, peers: list[PeerRow], serving: list[str], spare_slots: int
) -> ListingContent:
    """Our Nostr listing: the mesh, a standing invite for it, what it serves and how full it is."""
    listed = sorted({m for m in serving if 0 < len(m) <= MAX_MODEL_NAME and m.isprintable()})[:MAX_LISTED_MODELS]
    # MeshService.token() is already re-issued near expiry and whenever our mesh changed.
    mesh_id, token = mesh.mesh_id, mesh.token()
    assert mesh_id is not None and token is not None  # listed only while we are in a mesh
    return ListingContent(
        mesh_id=mesh_id,
        invite_token=token,
        serving=tuple(listed),
        node_count=min(1 + len(peers), MAX_LISTING_COUNT),
        client_count=min(sum(1 for p in peers if p.role == "client"), MAX_LISTING_COUNT),
        max_clients=settings.max_clients,
        spare_slots=min(spare_slots, MAX_LISTING_COUNT),
        name=settings.mesh_name,
        region=settings.region,
        version=__version__[:64],
    )
