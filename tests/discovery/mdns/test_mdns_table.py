"""AdvertTable: TTL expiry, goodbyes, own packets, bound (time passed in, no waiting)."""

from __future__ import annotations

import dataclasses

from discovery_helpers import make_advert
from hydra_node.discovery.mdns.table import AdvertTable
from hydra_node.discovery.mdns.wire import MdnsResponse


def resp(*adverts, ttl=120, goodbyes=()):
    return MdnsResponse(adverts=tuple((a, ttl) for a in adverts), goodbyes=tuple(goodbyes))


def test_ttl_expiry_and_refresh():
    t = AdvertTable(own_origin="00" * 8)
    a = make_advert("a")
    assert t.apply(resp(a, ttl=10), now=0.0)
    assert [s.advert for s in t.snapshot(5.0)] == [a]
    assert t.next_deadline() == 10.0
    assert not t.apply(resp(a, ttl=10), now=8.0)  # refresh, no visible change
    assert t.next_deadline() == 18.0
    assert t.snapshot(17.9) and not t.snapshot(18.0)
    gen = t.generation
    assert t.expire(18.0) and t.generation > gen and len(t) == 0


def test_goodbye_removes_and_change_is_visible():
    t = AdvertTable(own_origin="00" * 8)
    a, b = make_advert("a"), make_advert("b")
    t.apply(resp(a, b), now=0)
    assert t.apply(resp(goodbyes=[a.instance]), now=1)
    assert [s.advert for s in t.snapshot(1)] == [b]
    assert not t.apply(resp(goodbyes=["hydra-unknown"]), now=1)
    changed = dataclasses.replace(b, node_count=5)
    assert t.apply(resp(changed), now=2) and t.snapshot(2)[0].advert.node_count == 5
    assert t.snapshot(2)[0].first_seen == 0


def test_own_origin_is_dropped():
    mine = make_advert("me")
    t = AdvertTable(own_origin=mine.origin)
    assert not t.apply(resp(mine), now=0)
    assert len(t) == 0 and t.dropped_own == 1


def test_bound_refuses_new_instances_but_refreshes_known():
    t = AdvertTable(own_origin="00" * 8, max_adverts=2)
    a, b, c = make_advert("a"), make_advert("b"), make_advert("c")
    t.apply(resp(a, b), now=0)
    assert not t.apply(resp(c), now=1)
    assert t.dropped_full == 1 and len(t) == 2
    t.apply(resp(a, ttl=500), now=2)
    assert t.next_deadline() == 120
    t.expire(121)  # b expired: room again
    assert t.apply(resp(c), now=121) and len(t) == 2


def test_short_unicast_ttl_does_not_cut_a_longer_one():
    t = AdvertTable(own_origin="00" * 8)
    a = make_advert("a")
    t.apply(resp(a, ttl=120), now=0)
    t.apply(resp(a, ttl=10), now=1)
    assert t.next_deadline() == 120
