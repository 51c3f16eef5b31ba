"""NIP-01 relay messages: encoders, and untrusted text -> a message or RelayProtocolError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st
from nostr_sdk import Keys

from hydra_node.discovery.nostr.events import ListingContent, build_listing_event
from hydra_node.discovery.nostr.wire import (
    RelayAuth,
    RelayClosed,
    RelayEose,
    RelayEvent,
    RelayNotice,
    RelayOk,
    RelayProtocolError,
    decode_relay_message,
    encode_close,
    encode_event,
    encode_req,
)


def test_encoders():
    ev = build_listing_event(Keys.generate(), ListingContent(mesh_id="m", invite_token="t"), now=1_800_000_000)
    verb, obj = json.loads(encode_event(ev))
    assert verb == "EVENT" and obj["id"] == ev.id().to_hex()
    assert json.loads(encode_req("s", [{"kinds": [31990]}])) == ["REQ", "s", {"kinds": [31990]}]
    assert json.loads(encode_close("s")) == ["CLOSE", "s"]
    with pytest.raises(ValueError):
        encode_req("", [])
    with pytest.raises(ValueError):
        encode_close("x" * 65)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('["EVENT","s",{"id":"x"}]', RelayEvent("s", {"id": "x"})),
        ('["OK","id",true,""]', RelayOk("id", True, "")),
        ('["OK","id",false,"blocked: no"]', RelayOk("id", False, "blocked: no")),
        ('["OK","id",false]', RelayOk("id", False, "")),
        ('["EOSE","s"]', RelayEose("s")),
        ('["CLOSED","s","auth-required: x"]', RelayClosed("s", "auth-required: x")),
        ('["NOTICE","hello"]', RelayNotice("hello")),
        ('["AUTH","challenge"]', RelayAuth("challenge")),
    ],
)
def test_decode(text, expected):
    assert decode_relay_message(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{}",
        "[]",
        "[1]",
        '["EVENT","s"]',
        '["EVENT",1,{}]',
        '["OK","id","yes"]',
        '["WHAT"]',
        '["EOSE"]',
        "x" * 200_000,
        "[" * 10000,
    ],
)
def test_decode_rejects(text):
    with pytest.raises(RelayProtocolError):
        decode_relay_message(text)


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=200)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=12,
    ).map(json.dumps)
)
def test_untrusted_text_gives_message_or_typed_error(text):
    try:
        decode_relay_message(text)
    except RelayProtocolError:
        pass
