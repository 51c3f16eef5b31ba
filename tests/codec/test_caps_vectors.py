"""protocol/vectors/caps.json: a host's ``model_caps`` announcement key, the ``tokenize`` stream's
frames and requests with the capability and sampling fields (protocol/README.md sections 11.3 and
11.9), decoded by the strict decoders and encoded back to the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hydra_node.codec.framing import MessageDecoder, encode_message
from hydra_node.inference import GenerationRequest, ModelCaps, TokenizeRequest
from hydra_node.mesh.wire import cbor
from hydra_node.routing.remote_tokenize import MAX_TOKENIZE_REPLY_BYTES, MAX_TOKENIZE_REQUEST_BYTES, reply_from_frame
from hydra_node.runtime.hosting.caps_wire import parse_caps_extra
from hydra_node.inference.errors import RemoteError
from vector_json import from_json

DOC = json.loads((Path(__file__).resolve().parents[2] / "protocol" / "vectors" / "caps.json").read_text())


def _frame(hexdata: str, limit: int) -> dict:
    decoder = MessageDecoder(limit)
    decoder.receive_data(bytes.fromhex(hexdata))
    msg = decoder.next_message()
    assert msg is not None
    return msg


def test_the_announced_caps_decode_to_each_models_capabilities():
    v = DOC["announce_extra"]
    extra = cbor.decode(bytes.fromhex(v["hex"]))
    assert extra == from_json(v["decoded"])
    peer = parse_caps_extra(extra)
    assert peer.malformed == 0
    assert {m: c.to_wire() for m, c in peer.models.items()} == from_json(v["parsed"])
    assert peer.models["coder"] == ModelCaps(fim=True) and peer.models["plain"] == ModelCaps()


@pytest.mark.parametrize("v", DOC["invalid_extras"], ids=lambda v: v["name"])
def test_a_malformed_caps_value_is_dropped_and_counted(v):
    assert parse_caps_extra(from_json(v["decoded"])).malformed == v["malformed"]


@pytest.mark.parametrize("v", DOC["tokenize"]["requests"], ids=lambda v: v["name"])
def test_tokenize_request_frames_decode_and_encode_back(v):
    msg = _frame(v["frame"], MAX_TOKENIZE_REQUEST_BYTES)
    assert msg["op"] == "tokenize" and msg["req"] == from_json(v["decoded"])
    req = TokenizeRequest.from_wire(msg["req"])
    assert (
        encode_message({"op": "tokenize", "req": req.to_wire()}, limit=MAX_TOKENIZE_REQUEST_BYTES).hex() == v["frame"]
    )


@pytest.mark.parametrize("v", DOC["tokenize"]["replies"], ids=lambda v: v["name"])
def test_tokenize_reply_frames_are_a_result_or_the_hosts_error(v):
    msg = _frame(v["frame"], MAX_TOKENIZE_REPLY_BYTES)
    assert msg == from_json(v["decoded"])
    if msg["op"] == "error":
        with pytest.raises(RemoteError) as err:
            reply_from_frame(msg)
        assert err.value.status == 502 and err.value.remote_status == msg["status"]
        return
    res = reply_from_frame(msg)
    assert encode_message({"op": "tokenized", **res.to_wire()}, limit=MAX_TOKENIZE_REPLY_BYTES).hex() == v["frame"]


@pytest.mark.parametrize("v", DOC["requests"], ids=lambda v: v["name"])
def test_requests_with_the_new_fields_decode_and_encode_back(v):
    wire = cbor.decode(bytes.fromhex(v["hex"]))
    assert wire == from_json(v["decoded"])
    assert cbor.encode(GenerationRequest.from_wire(wire).to_wire()).hex() == v["hex"]
