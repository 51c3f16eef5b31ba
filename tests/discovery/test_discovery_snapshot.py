"""discover_once: one bounded browse of both sources, rendered as JSON and text."""

from __future__ import annotations

import json

import pytest
import trio
from nostr_sdk import Keys

from discovery_helpers import FAST_RELAY, make_advert
from hydra_node.discovery.mdns.service import MdnsService
from hydra_node.discovery.nostr.events import ListingContent
from hydra_node.discovery.nostr.services import DiscovererConfig, NostrPublisher, PublisherConfig
from hydra_node.discovery.snapshot import discover_once, format_report, report_to_json, discovery_sources


async def test_discover_once_sees_lan_and_nostr(nursery, mdns_config, relay_url):
    advert = make_advert("lan-node")
    await nursery.start(MdnsService(mdns_config, advert).run)
    content = ListingContent(mesh_id="mesh-9", invite_token="invite-9", name="lab", serving=("m",))
    publisher = NostrPublisher(Keys.generate(), lambda: content, PublisherConfig(relays=(relay_url,), relay=FAST_RELAY))
    await nursery.start(publisher.run)
    with trio.fail_after(10):
        report = await discover_once(
            wait_s=5, mdns=mdns_config, nostr=DiscovererConfig(relays=(relay_url,), relay=FAST_RELAY)
        )
    assert report.lan == (advert,)
    (scored,) = report.nostr
    assert scored.listing.content == content and scored.reason == "named_mesh_needs_mesh_name"
    data = json.loads(json.dumps(report_to_json(report)))
    assert data["lan"][0]["name"] == "lan-node" and data["nostr"][0]["invite_token"] == "invite-9"
    text = format_report(report)
    assert "lan-node" in text and "skipped (named_mesh_needs_mesh_name)" in text


def test_discovery_sources():
    assert discovery_sources("mdns") == (True, False)
    assert discovery_sources("both") == (True, True)
    with pytest.raises(ValueError):
        discovery_sources("carrier-pigeon")
