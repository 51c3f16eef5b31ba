"""Mesh discovery: mDNS on the LAN and Nostr listings (see ``docs/discovery.md``).

Sans-IO cores: :mod:`mdns_wire`, :mod:`mdns_table`, :mod:`nostr_events`,
:mod:`nostr_table`, :mod:`nostr_wire`, :mod:`auto`, :mod:`node_choice` (settings, the LAN
fingerprint, join candidates), :mod:`adverts` (what we advertise and publish).
trio drivers: :mod:`mdns` and :mod:`nostr_relay` / :mod:`nostr_services`; :mod:`service` runs
discovery inside ``serve`` (:class:`DiscoveryService`), :mod:`commands` is its command line.
"""

from hydra_node.discovery.auto import AutoContext, ListingProbe, ListingScore, explain, rank_listings, score_listing
from hydra_node.discovery.mdns.service import MDNS_GROUP, MDNS_PORT, MdnsConfig, MdnsService, MdnsStatistics
from hydra_node.discovery.mdns.wire import SERVICE, MdnsAdvert, MdnsAdvertError, MdnsDecodeError
from hydra_node.discovery.nostr.events import (
    Deletion,
    Listing,
    ListingContent,
    ListingRejected,
    RejectReason,
    build_deletion_event,
    build_listing_event,
    parse_event,
)
from hydra_node.discovery.nostr.keys import NostrKeyError, load_or_create_nostr_keys, nostr_key_path
from hydra_node.discovery.nostr.relay import DEFAULT_RELAYS, RelayConfig, RelayConnection, validate_relay_url
from hydra_node.discovery.nostr.services import (
    DiscovererConfig,
    NostrDiscoverer,
    NostrPublisher,
    PublisherConfig,
    relays_or_default,
)
from hydra_node.discovery.node_choice import DiscoverySettings, lan_fingerprint, lan_fingerprint_matches
from hydra_node.discovery.nostr.table import ListingTable
from hydra_node.discovery.snapshot import (
    DiscoveryReport,
    discover_once,
    discovery_sources,
    format_report,
    report_to_json,
)

__all__ = [
    "AutoContext",
    "DEFAULT_RELAYS",
    "Deletion",
    "DiscovererConfig",
    "DiscoveryReport",
    "DiscoverySettings",
    "Listing",
    "ListingContent",
    "ListingProbe",
    "ListingRejected",
    "ListingScore",
    "ListingTable",
    "MDNS_GROUP",
    "MDNS_PORT",
    "MdnsAdvert",
    "MdnsAdvertError",
    "MdnsConfig",
    "MdnsDecodeError",
    "MdnsService",
    "MdnsStatistics",
    "NostrDiscoverer",
    "NostrKeyError",
    "NostrPublisher",
    "PublisherConfig",
    "RejectReason",
    "RelayConfig",
    "RelayConnection",
    "SERVICE",
    "build_deletion_event",
    "build_listing_event",
    "discover_once",
    "discovery_sources",
    "explain",
    "format_report",
    "lan_fingerprint",
    "lan_fingerprint_matches",
    "load_or_create_nostr_keys",
    "nostr_key_path",
    "parse_event",
    "rank_listings",
    "relays_or_default",
    "report_to_json",
    "score_listing",
    "validate_relay_url",
]
