"""--auto scoring: upstream's terms, measured reachability/RTT, eligibility, and ranking properties."""

from __future__ import annotations

import dataclasses
import hashlib

from hypothesis import given, settings, strategies as st

from hydra_node.discovery.auto import (
    AutoContext,
    ListingProbe,
    explain,
    rank_listings,
    score_listing,
)
from hydra_node.discovery.nostr.events import Listing, ListingContent

NOW = 1_800_000_000


def listing(pubkey="aa", mesh="m1", *, created=NOW, **content) -> Listing:
    c = ListingContent(mesh_id=mesh, invite_token="tok", **content)
    event_id = hashlib.sha256(f"{pubkey}{created}{c.to_json()}".encode()).hexdigest()
    return Listing(
        pubkey=pubkey * 32,
        d=f"hydra:{mesh}",
        event_id=event_id,
        created_at=created,
        expires_at=created + 120,
        content=c,
    )


def terms(s) -> dict:
    return dict(s.terms)


def test_upstream_terms():
    s = score_listing(listing(node_count=3, serving=("a", "b"), max_clients=10, client_count=4), AutoContext(now=NOW))
    assert s.eligible and terms(s) == {"base": 100, "public_mesh": 300, "headroom": 6, "nodes": 15, "serving": 20}
    assert s.total == 441


def test_sticky_wanted_and_can_help():
    ctx = AutoContext(now=NOW, last_mesh_id="m1", wanted_models=frozenset({"a"}), local_models=frozenset({"z"}))
    s = score_listing(listing(serving=("a",), wanted=("z",)), ctx)
    t = terms(s)
    assert t["sticky"] == 500 and t["wanted_served"] == 40 and t["can_help"] == 15


def test_full_unreachable_named_and_expired_are_ineligible():
    ctx = AutoContext(now=NOW)
    assert score_listing(listing(max_clients=2, client_count=2), ctx).reason == "full"
    assert score_listing(listing(name="private"), ctx).reason == "named_mesh_needs_mesh_name"
    assert score_listing(listing(name="Hydra"), ctx).eligible  # the app name counts as public
    assert score_listing(listing(name="private"), dataclasses.replace(ctx, mesh_name="Private")).eligible
    assert score_listing(listing(), dataclasses.replace(ctx, mesh_name="other")).reason == "name_mismatch"
    one = listing()
    assert score_listing(one, dataclasses.replace(ctx, probes={one.key: ListingProbe(False)})).reason == "unreachable"
    assert score_listing(listing(created=NOW - 500), ctx).reason == "expired"


def test_rtt_and_staleness():
    one = listing()
    fast = score_listing(one, AutoContext(now=NOW, probes={one.key: ListingProbe(True, 10.0)}))
    slow = score_listing(one, AutoContext(now=NOW, probes={one.key: ListingProbe(True, 400.0)}))
    assert terms(fast)["rtt"] == 95 and "rtt" in terms(slow) and terms(slow)["rtt"] == 0
    stale = score_listing(listing(created=NOW - 90), AutoContext(now=NOW))
    assert terms(stale)["stale"] == -30


def test_model_list_spam_is_capped():
    many = score_listing(listing(serving=tuple(f"m{i}" for i in range(30))), AutoContext(now=NOW))
    assert terms(many)["serving"] == 80


def test_rank_order_and_fallbacks():
    a = listing("aa", "m1", node_count=1)
    b = listing("bb", "m2", node_count=8)
    c = listing("cc", "m3", max_clients=1, client_count=1)
    d = listing("dd", "m4", node_count=1)
    ctx = AutoContext(
        now=NOW, last_mesh_id="m1", probes={d.key: ListingProbe(True, 5.0), a.key: ListingProbe(True, 50.0)}
    )
    ranked = rank_listings([b, c, d, a], ctx)
    assert [s.listing for s in ranked] == [a, d, b]  # sticky first, then d (fast), then b; c is full
    full = explain([b, c, d, a], ctx)
    assert [s.listing for s in full] == [a, d, b, c] and not full[-1].eligible


def test_ties_break_by_rtt_then_nodes_then_key():
    x, y = listing("aa", "m1"), listing("bb", "m2")
    ranked = rank_listings([y, x], AutoContext(now=NOW))
    assert [s.listing for s in ranked] == [x, y]


listings_st = st.builds(
    listing,
    pubkey=st.sampled_from(["aa", "bb", "cc", "dd"]),
    mesh=st.sampled_from(["m1", "m2", "m3"]),
    created=st.integers(NOW - 119, NOW),
    node_count=st.integers(1, 50),
    client_count=st.integers(0, 20),
    max_clients=st.integers(0, 20),
    spare_slots=st.integers(0, 30),
    serving=st.lists(st.sampled_from(["a", "b", "c"]), unique=True).map(tuple),
    wanted=st.lists(st.sampled_from(["a", "b", "z"]), unique=True).map(tuple),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(listings_st, max_size=8), st.sampled_from([None, "m1", "m2"]))
def test_ranking_properties(items, last):
    ctx = AutoContext(now=NOW, last_mesh_id=last, wanted_models=frozenset({"a"}))
    ranked = rank_listings(items, ctx)
    totals = [s.total for s in ranked]
    assert totals == sorted(totals, reverse=True)
    assert all(s.eligible and s.total > 0 for s in ranked)
    assert rank_listings(list(reversed(items)), ctx) == ranked  # deterministic
    for s in ranked:
        c = s.listing.content
        assert not (c.max_clients and c.client_count >= c.max_clients)


@settings(max_examples=100, deadline=None)
@given(listings_st, st.integers(1, 10))
def test_more_nodes_or_lower_rtt_never_hurts(one, extra):
    ctx = AutoContext(now=NOW)
    content = dataclasses.replace(one.content, node_count=one.content.node_count + extra)
    bigger = dataclasses.replace(one, content=content)
    assert score_listing(bigger, ctx).total >= score_listing(one, ctx).total
    near = AutoContext(now=NOW, probes={one.key: ListingProbe(True, 5.0)})
    far = AutoContext(now=NOW, probes={one.key: ListingProbe(True, 5.0 + extra * 20)})
    assert score_listing(one, near).total >= score_listing(one, far).total
