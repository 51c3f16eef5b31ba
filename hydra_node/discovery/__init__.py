"""Mesh discovery: mDNS on the LAN and Nostr listings (see ``docs/discovery.md``).

Sans-IO cores: :mod:`mdns_wire`, :mod:`mdns_table`, :mod:`nostr_events`,
:mod:`nostr_table`, :mod:`nostr_wire`, :mod:`lan_admission`, :mod:`auto`.
trio drivers: :mod:`mdns` and :mod:`nostr_relay` / :mod:`nostr_services`.
"""

from hydra_node.discovery.auto import AutoContext, Probe, ScoreBreakdown, explain, rank_listings, score_listing
from hydra_node.discovery.lan_admission import (
    AdmissionError,
    InviteParser,
    MeshSecret,
    fingerprint_matches,
    make_challenge,
    make_proof,
    may_join,
    mesh_secret_from_invite,
    token_fingerprint,
    verify_proof,
)
from hydra_node.discovery.mdns import MDNS_GROUP, MDNS_PORT, MdnsConfig, MdnsService, MdnsStatistics
from hydra_node.discovery.mdns_wire import SERVICE, MdnsAdvert, MdnsAdvertError, MdnsDecodeError
from hydra_node.discovery.nostr_events import (
    Deletion,
    Listing,
    ListingContent,
    ListingRejected,
    RejectReason,
    build_deletion_event,
    build_listing_event,
    parse_event,
)
from hydra_node.discovery.nostr_keys import NostrKeyError, load_or_create_nostr_keys, nostr_key_path
from hydra_node.discovery.nostr_relay import DEFAULT_RELAYS, RelayConfig, RelayConnection, validate_relay_url
from hydra_node.discovery.nostr_services import (
    DiscovererConfig,
    NostrDiscoverer,
    NostrPublisher,
    PublisherConfig,
    relays_or_default,
)
from hydra_node.discovery.nostr_table import ListingTable
from hydra_node.discovery.snapshot import (
    DiscoveryReport,
    discover_once,
    discovery_sources,
    format_report,
    report_to_json,
)

__all__ = [
    "AdmissionError", "AutoContext", "DEFAULT_RELAYS", "Deletion", "DiscovererConfig", "DiscoveryReport",
    "discover_once", "discovery_sources", "format_report", "report_to_json", "InviteParser", "Listing",
    "ListingContent", "ListingRejected", "ListingTable", "MDNS_GROUP", "MDNS_PORT", "MdnsAdvert", "MdnsAdvertError",
    "MdnsConfig", "MdnsDecodeError", "MdnsService", "MdnsStatistics", "MeshSecret", "NostrDiscoverer",
    "NostrKeyError", "NostrPublisher", "Probe", "PublisherConfig", "RejectReason", "RelayConfig", "RelayConnection",
    "SERVICE", "ScoreBreakdown", "build_deletion_event", "build_listing_event", "explain", "fingerprint_matches",
    "load_or_create_nostr_keys", "make_challenge", "make_proof", "may_join", "mesh_secret_from_invite",
    "nostr_key_path", "parse_event", "rank_listings", "relays_or_default", "score_listing", "token_fingerprint",
    "validate_relay_url", "verify_proof",
]
