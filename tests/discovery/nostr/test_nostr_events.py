"""Listing events: build, verify, parse strictly; every rejection is typed and named."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings, strategies as st
from nostr_sdk import EventBuilder, Keys, Kind, Tag, Timestamp

from hydra_node.discovery.nostr.events import (
    MAX_CONTENT,
    Deletion,
    Listing,
    ListingContent,
    ListingRejected,
    RejectReason,
    build_deletion_event,
    build_listing_event,
    parse_event,
)

NOW = 1_800_000_000
KEYS = Keys.generate()
CONTENT = ListingContent(
    mesh_id="mesh-1",
    invite_token="tok-abc",
    serving=("m1",),
    wanted=("m2",),
    node_count=3,
    client_count=1,
    max_clients=10,
    vram_bytes=8 << 30,
    spare_slots=2,
    name="lab",
    region="eu",
    version="0.1.0",
)


def obj(event) -> dict:
    return json.loads(event.as_json())


def raw_event(kind: int, content: str, tags: list[list[str]], *, created=NOW, keys=KEYS) -> dict:
    b = EventBuilder(Kind(kind), content).tags([Tag.parse(t) for t in tags])
    return obj(b.custom_created_at(Timestamp.from_secs(created)).finalize(keys))


GOOD_TAGS = [["d", "hydra:mesh-1"], ["k", "hydra"], ["t", "hydra"], ["expiration", str(NOW + 120)]]


def rejected(raw, now=NOW) -> RejectReason:
    with pytest.raises(ListingRejected) as info:
        parse_event(raw, now=now)
    return info.value.reason


def test_round_trip_and_tags():
    ev = build_listing_event(KEYS, CONTENT, now=NOW, ttl_s=120)
    o = obj(ev)
    assert o["kind"] == 31990
    assert ["d", "hydra:mesh-1"] in o["tags"] and ["k", "hydra"] in o["tags"] and ["t", "hydra"] in o["tags"]
    assert ["expiration", str(NOW + 120)] in o["tags"]
    listing = parse_event(o, now=NOW + 1)
    assert isinstance(listing, Listing)
    assert listing.content == CONTENT and listing.key == (KEYS.public_key().to_hex(), "hydra:mesh-1")
    assert listing.expires_at == NOW + 120 and listing.event_id == ev.id().to_hex()
    assert parse_event(ev.as_json(), now=NOW).content == CONTENT  # text works too


def test_tampered_content_and_wrong_signature():
    o = obj(build_listing_event(KEYS, CONTENT, now=NOW))
    tampered = dict(o, content=o["content"].replace("tok-abc", "tok-evil"))
    assert rejected(tampered) is RejectReason.BAD_SIGNATURE
    other = obj(build_listing_event(Keys.generate(), CONTENT, now=NOW))
    assert rejected(dict(o, sig=other["sig"])) is RejectReason.BAD_SIGNATURE
    assert rejected(dict(o, pubkey=other["pubkey"])) is RejectReason.BAD_SIGNATURE
    assert rejected(dict(o, sig="00" * 64)) is RejectReason.BAD_SIGNATURE


@pytest.mark.parametrize(
    "kind, tags, reason",
    [
        (1, GOOD_TAGS, RejectReason.WRONG_KIND),
        (31990, [t for t in GOOD_TAGS if t[0] != "expiration"], RejectReason.MISSING_TAG),
        (31990, [t for t in GOOD_TAGS if t[0] != "d"], RejectReason.MISSING_TAG),
        (31990, [["k", "other"] if t[0] == "k" else t for t in GOOD_TAGS], RejectReason.MISSING_TAG),
        (31990, [["expiration", "soon"] if t[0] == "expiration" else t for t in GOOD_TAGS], RejectReason.MISSING_TAG),
        (31990, [["expiration", str(NOW - 1)] if t[0] == "expiration" else t for t in GOOD_TAGS], RejectReason.EXPIRED),
        (
            31990,
            [["expiration", str(NOW + 10**7)] if t[0] == "expiration" else t for t in GOOD_TAGS],
            RejectReason.BAD_TIME,
        ),
        (31990, GOOD_TAGS + [["t", "mesh-llm"]], RejectReason.UPSTREAM),
        (31990, [["d", "mesh-llm"], ["k", "hydra"], ["expiration", str(NOW + 120)]], RejectReason.UPSTREAM),
        (31990, [["d", "hydra:other"]] + GOOD_TAGS[1:], RejectReason.D_MISMATCH),
    ],
)
def test_rejections_by_tag_and_kind(kind, tags, reason):
    assert rejected(raw_event(kind, CONTENT.to_json(), tags)) is reason


def test_future_created_at_is_refused():
    assert rejected(raw_event(31990, CONTENT.to_json(), GOOD_TAGS, created=NOW + 3600)) is RejectReason.BAD_TIME


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        json.dumps({"v": 2, "mesh_id": "mesh-1", "invite_token": "t"}),
        json.dumps({"v": 1, "mesh_id": "mesh-1"}),
        json.dumps({"v": 1, "mesh_id": "mesh-1", "invite_token": "t", "extra": 1}),
        json.dumps({"v": 1, "mesh_id": "mesh-1", "invite_token": "t", "node_count": 0}),
        json.dumps({"v": 1, "mesh_id": "mesh-1", "invite_token": "t", "node_count": True}),
        json.dumps({"v": 1, "mesh_id": "mesh-1", "invite_token": "t", "serving": "m1"}),
        json.dumps({"v": 1, "mesh_id": "mesh-1", "invite_token": "t", "serving": ["m"] * 2}),
        json.dumps({"v": 1, "mesh_id": "mesh-1", "invite_token": "t", "serving": [f"m{i}" for i in range(40)]}),
        json.dumps({"v": 1, "mesh_id": "mesh-1", "invite_token": "t", "name": 5}),
        json.dumps({"v": 1, "mesh_id": "mesh-1", "invite_token": "t", "max_clients": -1}),
        "[" * 5000,
    ],
)
def test_bad_content_is_refused(content):
    assert rejected(raw_event(31990, content, GOOD_TAGS)) is RejectReason.BAD_CONTENT


def test_oversized_event_and_content():
    big = json.dumps({"v": 1, "mesh_id": "mesh-1", "invite_token": "t", "name": "x" * (MAX_CONTENT + 10)})
    assert rejected(raw_event(31990, big, GOOD_TAGS)) is RejectReason.TOO_LARGE
    assert rejected("x" * 20000) is RejectReason.TOO_LARGE


@pytest.mark.parametrize("raw", [{}, {"kind": 31990}, [], "null", "{", {"id": "zz", "sig": 1}, object()])
def test_malformed_objects(raw):
    assert rejected(raw) is RejectReason.MALFORMED


def test_deletion_event():
    ev = build_listing_event(KEYS, CONTENT, now=NOW)
    deletion = parse_event(obj(build_deletion_event(KEYS, ev, now=NOW + 5)), now=NOW + 5)
    assert isinstance(deletion, Deletion)
    assert deletion.pubkey == KEYS.public_key().to_hex()
    assert deletion.coordinates == ("hydra:mesh-1",) and deletion.event_ids == (ev.id().to_hex(),)
    o = obj(build_deletion_event(KEYS, ev, now=NOW))
    assert ["k", "31990"] in o["tags"] and ["t", "hydra"] in o["tags"]
    assert ["a", f"31990:{KEYS.public_key().to_hex()}:hydra:mesh-1"] in o["tags"]
    # a deletion naming someone else's coordinate names nothing of theirs
    foreign = raw_event(5, "", [["a", f"31990:{'ab' * 32}:hydra:mesh-1"]])
    assert rejected(foreign) is RejectReason.MISSING_TAG


def test_content_validation_on_build():
    for change in (
        {"mesh_id": "has space"},
        {"invite_token": ""},
        {"serving": ("a", "a")},
        {"node_count": 0},
        {"name": ""},
        {"vram_bytes": -1},
        {"invite_token": "é"},
    ):
        with pytest.raises(ValueError):
            dataclasses.replace(CONTENT, **change)


models = st.lists(
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20), max_size=8, unique=True
).map(tuple)


@settings(max_examples=60, deadline=None)
@given(
    st.builds(
        ListingContent,
        mesh_id=st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True),
        invite_token=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=100),
        serving=models,
        wanted=models,
        node_count=st.integers(1, 1000),
        client_count=st.integers(0, 100),
        max_clients=st.integers(0, 100),
        name=st.none() | st.text(min_size=1, max_size=20).filter(str.isprintable),
    )
)
def test_content_round_trips(content):
    assert ListingContent.from_json(content.to_json()) == content


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=20,
    )
)
def test_untrusted_json_gives_listing_or_typed_rejection(value):
    try:
        parse_event(value, now=NOW)
    except ListingRejected:
        pass
    try:
        ListingContent.from_json(json.dumps(value))
    except ListingRejected:
        pass
