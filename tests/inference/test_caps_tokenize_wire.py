"""The wire forms of model capabilities (``ModelCaps``, the announcement's ``model_caps``) and of
the tokenizer ops (``TokenizeRequest``/``TokenizeResult``), read strictly (pure)."""

from __future__ import annotations

import pytest

from hydra_node.inference import (
    NO_CAPS,
    InvalidRequest,
    MalformedRemoteEvent,
    ModelCaps,
    TokenizeRequest,
    TokenizeResult,
)
from hydra_node.mesh.membership.announcement import MAX_EXTRA_ITEMS
from hydra_node.runtime.artifacts.peer_wire import extra_items
from hydra_node.runtime.hosting.caps_wire import CAPS_KEY, MAX_CAPS_MODELS, caps_extra, parse_caps_extra

# ---- ModelCaps --------------------------------------------------------------------------------


def test_caps_send_only_what_differs_from_the_defaults_and_read_back():
    assert NO_CAPS.to_wire() == {}
    caps = ModelCaps("think", thinks=True, switch=True, fim=True)
    assert caps.to_wire() == {"reasoning": "think", "thinks": True, "switch": True, "fim": True}
    assert ModelCaps.from_wire(caps.to_wire()) == caps and ModelCaps.from_wire({}) == NO_CAPS
    assert ModelCaps.from_wire({"fim": True, "newer_key": [1]}) == ModelCaps(fim=True)  # blind to unknown keys
    assert caps.reasons and not NO_CAPS.reasons


@pytest.mark.parametrize(
    "wire", [[], "think", {"reasoning": "harmony"}, {"reasoning": 1}, {"fim": 1}, {"thinks": "yes"}, {"switch": None}]
)
def test_malformed_caps_are_a_malformed_remote_event(wire):
    with pytest.raises(MalformedRemoteEvent):
        ModelCaps.from_wire(wire)


def test_an_unknown_reasoning_format_is_refused_at_construction():
    with pytest.raises(ValueError):
        ModelCaps("harmony")


# ---- the announcement's model_caps ------------------------------------------------------------------


def test_model_caps_carry_every_known_model_and_nothing_for_unknown_ones():
    extra = caps_extra([("a", ModelCaps(fim=True)), ("b", NO_CAPS), ("c", None)])
    assert extra == {CAPS_KEY: {"a": {"fim": True}, "b": {}}}
    peer = parse_caps_extra(extra)
    assert peer.models == {"a": ModelCaps(fim=True), "b": NO_CAPS} and peer.malformed == 0
    assert caps_extra([("c", None)]) == {} and parse_caps_extra({}).models == {}


def test_model_caps_stay_within_their_share_of_the_extra_items():
    many = [(f"model-{i}", ModelCaps("think", thinks=True, switch=True, fim=True)) for i in range(40)]
    extra = caps_extra(many)
    assert len(extra[CAPS_KEY]) == MAX_CAPS_MODELS
    assert extra_items(extra[CAPS_KEY]) <= 1 + 5 * MAX_CAPS_MODELS < MAX_EXTRA_ITEMS // 4


def test_a_peers_malformed_entries_are_dropped_and_counted_never_raised():
    peer = parse_caps_extra(
        {CAPS_KEY: {"ok": {"reasoning": "gpt-oss", "thinks": True}, "bad": {"fim": "yes"}, "": {}, "odd": 5}}
    )
    assert peer.models == {"ok": ModelCaps("gpt-oss", thinks=True)} and peer.malformed == 3
    assert parse_caps_extra({CAPS_KEY: ["not", "a", "map"]}).malformed == 1


# ---- TokenizeRequest / TokenizeResult ------------------------------------------------------------


def test_a_tokenize_request_and_its_result_cross_the_wire_unchanged():
    req = TokenizeRequest("m", "tokenize", content="héllo <|im_start|>", add_special=True, with_pieces=True)
    assert TokenizeRequest.from_wire(req.to_wire()) == req
    det = TokenizeRequest("m", "detokenize", tokens=(1, 2, 3))
    assert TokenizeRequest.from_wire(det.to_wire()) == det
    res = TokenizeResult(tokens=(5, 6), pieces=("a", b"\xe2\x82"), served_by="n")
    assert TokenizeResult.from_wire(res.to_wire()) == res


@pytest.mark.parametrize(
    "wire",
    [
        {"model": "m", "op": "split"},
        {"model": "m", "op": "detokenize", "tokens": [-1]},
        {"model": "m", "op": "detokenize", "tokens": [True]},
        {"model": "m", "op": "tokenize", "content": 5},
        {"model": "m", "op": "tokenize", "add_special": "yes"},
        {"op": "tokenize"},
        [],
    ],
)
def test_a_malformed_tokenize_request_is_a_400(wire):
    with pytest.raises(InvalidRequest):
        TokenizeRequest.from_wire(wire)


@pytest.mark.parametrize(
    "wire",
    [
        [],
        {"tokens": [1, -2]},
        {"tokens": [1, 2], "pieces": ["a"]},  # one piece per token
        {"tokens": [1], "pieces": [7]},
        {"tokens": [1], "pieces": ["x" * 257]},
        {"content": 5},
        {"served_by": "x" * 129},
    ],
)
def test_a_malformed_tokenize_reply_is_a_502(wire):
    with pytest.raises(MalformedRemoteEvent):
        TokenizeResult.from_wire(wire)
