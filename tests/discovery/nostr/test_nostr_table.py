"""ListingTable: newest per (pubkey, d) whatever the arrival order; deletions stick; bounded; counted."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings, strategies as st
from nostr_sdk import Keys

from hydra_node.discovery.nostr.events import ListingContent, build_deletion_event, build_listing_event
from hydra_node.discovery.nostr.table import ListingTable

NOW = 1_800_000_000
KEYS = [Keys.generate() for _ in range(3)]
BASE = ListingContent(mesh_id="mesh-1", invite_token="tok")


def raw(keys, created, *, mesh="mesh-1", node_count=1, ttl=120):
    content = dataclasses.replace(BASE, mesh_id=mesh, node_count=node_count)
    return json.loads(build_listing_event(keys, content, now=created, ttl_s=ttl).as_json())


def test_newest_wins_and_duplicates_are_quiet():
    t = ListingTable()
    old, new = raw(KEYS[0], NOW, node_count=1), raw(KEYS[0], NOW + 10, node_count=2)
    assert t.offer_raw(new, now=NOW + 10)
    assert not t.offer_raw(old, now=NOW + 10)
    assert not t.offer_raw(new, now=NOW + 10)  # same event from a second relay
    (listing,) = t.listings(NOW + 10)
    assert listing.content.node_count == 2
    assert t.statistics().rejected == {"stale": 1}


def test_distinct_keys_and_meshes_coexist_newest_first():
    t = ListingTable()
    t.offer_raw(raw(KEYS[0], NOW), now=NOW)
    t.offer_raw(raw(KEYS[1], NOW + 1), now=NOW)
    t.offer_raw(raw(KEYS[0], NOW + 2, mesh="mesh-2"), now=NOW)
    assert [(x.content.mesh_id, x.created_at) for x in t.listings(NOW + 3)] == [
        ("mesh-2", NOW + 2),
        ("mesh-1", NOW + 1),
        ("mesh-1", NOW),
    ]


def test_expiry():
    t = ListingTable()
    t.offer_raw(raw(KEYS[0], NOW, ttl=30), now=NOW)
    assert t.listings(NOW + 29) and not t.listings(NOW + 30)
    assert not t.offer_raw(raw(KEYS[1], NOW - 200, ttl=30), now=NOW)
    assert t.statistics().rejected == {"expired": 1}
    assert t.expire(NOW + 30) and t.statistics().listings == 0


def test_deletion_before_or_after_the_listing():
    for deletion_first in (False, True):
        t = ListingTable()
        listing = build_listing_event(KEYS[0], BASE, now=NOW)
        deletion = json.loads(build_deletion_event(KEYS[0], listing, now=NOW + 1).as_json())
        items = [json.loads(listing.as_json()), deletion]
        for item in reversed(items) if deletion_first else items:
            t.offer_raw(item, now=NOW + 1)
        assert t.listings(NOW + 1) == ()
        # a newer listing after the deletion is live again
        assert t.offer_raw(raw(KEYS[0], NOW + 5), now=NOW + 5)


def test_someone_elses_deletion_does_not_remove_my_listing():
    t = ListingTable()
    mine = build_listing_event(KEYS[0], BASE, now=NOW)
    t.offer_raw(json.loads(mine.as_json()), now=NOW)
    theirs = build_listing_event(KEYS[1], BASE, now=NOW)
    t.offer_raw(json.loads(build_deletion_event(KEYS[1], theirs, now=NOW + 1).as_json()), now=NOW + 1)
    assert len(t.listings(NOW + 1)) == 1


def test_bound_evicts_the_one_expiring_first():
    t = ListingTable(max_listings=2)
    t.offer_raw(raw(KEYS[0], NOW, ttl=50), now=NOW)
    t.offer_raw(raw(KEYS[1], NOW, ttl=100), now=NOW)
    assert t.offer_raw(raw(KEYS[2], NOW, ttl=120), now=NOW)
    assert {x.expires_at for x in t.listings(NOW)} == {NOW + 100, NOW + 120}
    assert not t.offer_raw(raw(KEYS[0], NOW, ttl=10, mesh="m3"), now=NOW)  # expires sooner than all: dropped
    assert t.statistics().evicted == 2 and t.statistics().listings == 2


EVENTS = [raw(KEYS[k], NOW + c, node_count=c + 1) for k in range(2) for c in range(3)]


@settings(max_examples=50, deadline=None)
@given(st.permutations(EVENTS))
def test_outcome_is_independent_of_arrival_order(order):
    t = ListingTable()
    for e in order:
        t.offer_raw(e, now=NOW)
    assert sorted((x.pubkey, x.content.node_count) for x in t.listings(NOW)) == sorted(
        (k.public_key().to_hex(), 3) for k in KEYS[:2]
    )
