"""protocol/vectors/generate.json: the generate stream's request (a continuation's ``resume_tokens``
and ``resume_skip``), delta events with ``tokens``, a request sent as the stream's body, and a
chat's ``images`` (with their bytes or elided; the host's ``images_missing``) (protocol/README.md
section 11.3), decoded by the strict decoders and encoded back to the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hydra_node.codec.framing import MessageDecoder
from hydra_node.inference import GenerationRequest, InvalidRequest, MalformedRemoteEvent, TextDelta, event_from_wire
from hydra_node.inference.errors import RemoteError
from hydra_node.inference.events import MAX_EVENT_FRAME_BYTES
from hydra_node.inference.images import IMAGE_MARK, ImageBlob, image_sha256
from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.constants import MAX_OPEN_HEADER_BYTES
from hydra_node.routing.remote import IMAGES_MISSING, body_length, generate_header, request_from_body
from vector_json import from_json

DOC = json.loads((Path(__file__).resolve().parents[2] / "protocol" / "vectors" / "generate.json").read_text())


@pytest.mark.parametrize("v", DOC["requests"], ids=lambda v: v["name"])
def test_requests_decode_and_encode_back_to_the_same_bytes(v):
    wire = cbor.decode(bytes.fromhex(v["hex"]))
    assert wire == from_json(v["decoded"])
    req = GenerationRequest.from_wire(wire)
    assert cbor.encode(req.to_wire()).hex() == v["hex"]
    assert list(req.resume_tokens) == wire.get("resume_tokens", []) and req.resume_skip == wire.get("resume_skip", 0)


@pytest.mark.parametrize("v", DOC["events"], ids=lambda v: v["name"])
def test_event_frames_decode_to_their_events(v):
    decoder = MessageDecoder(limit=MAX_EVENT_FRAME_BYTES)
    decoder.receive_data(bytes.fromhex(v["frame"]))
    msg = decoder.next_message()
    assert msg == {"op": "event", "ev": from_json(v["decoded"])}
    ev = event_from_wire(msg["ev"])
    assert ev.to_wire() == from_json(v["decoded"])
    if isinstance(ev, TextDelta):
        assert list(ev.tokens) == v["decoded"].get("tokens", [])


@pytest.mark.parametrize("v", DOC["invalid_requests"], ids=lambda v: v["name"])
def test_invalid_requests_are_refused_naming_the_field(v):
    with pytest.raises(InvalidRequest) as info:
        GenerationRequest.from_wire(from_json(v["decoded"]))
    assert info.value.param == v["param"]


@pytest.mark.parametrize("v", DOC["invalid_events"], ids=lambda v: v["name"])
def test_invalid_events_are_malformed(v):
    with pytest.raises(MalformedRemoteEvent):
        event_from_wire(from_json(v["decoded"]))


@pytest.mark.parametrize("v", DOC["bodies"], ids=lambda v: v["name"])
def test_a_body_decodes_to_its_request_and_only_a_large_one_is_sent_as_a_body(v):
    header = cbor.decode(bytes.fromhex(v["header_hex"]))
    assert header == from_json(v["header"])
    body = bytes.fromhex(v["body_hex"])
    length = body_length(header)
    assert length == len(body)
    req = request_from_body(body, length)
    assert req.to_wire() == from_json(v["decoded"])
    # the requester's choice: the header form whenever it fits, else exactly this header and body
    fits = len(cbor.encode({"kind": "generate", "req": req.to_wire()})) <= MAX_OPEN_HEADER_BYTES
    assert generate_header(req) == (({"kind": "generate", "req": req.to_wire()}, None) if fits else (header, body))


@pytest.mark.parametrize("v", DOC["invalid_bodies"], ids=lambda v: v["name"])
def test_invalid_bodies_are_refused(v):
    with pytest.raises(InvalidRequest) as info:
        length = body_length(from_json(v["header"]))
        assert length is not None
        request_from_body(bytes.fromhex(v["body_hex"]), length)
    assert v["error"] == "invalid_request" and info.value.param in ("body", None)


@pytest.mark.parametrize("v", DOC["images"]["requests"], ids=lambda v: v["name"])
def test_requests_with_images_decode_and_encode_back(v):
    wire = cbor.decode(bytes.fromhex(v["hex"]))
    assert wire == from_json(v["decoded"])
    req = GenerationRequest.from_wire(wire)
    assert cbor.encode(req.to_wire()).hex() == v["hex"]
    marks = sum(m.content.count(IMAGE_MARK) for m in req.messages)
    assert marks == len(req.images) == len(wire["images"]) and all(isinstance(im, ImageBlob) for im in req.images)
    for im, w in zip(req.images, wire["images"]):
        assert im.elided == ("data" not in w)
        if not im.elided:
            assert image_sha256(im.data) == im.sha256


def test_the_hosts_images_missing_answer_is_a_retryable_409_naming_the_hashes():
    v = DOC["images"]["images_missing"]
    decoder = MessageDecoder(limit=MAX_EVENT_FRAME_BYTES)
    decoder.receive_data(bytes.fromhex(v["frame"]))
    msg = decoder.next_message()
    assert msg == {"op": "event", "ev": from_json(v["decoded"])}
    with pytest.raises(RemoteError) as info:
        event_from_wire(msg["ev"])
    err = info.value
    assert (err.code, err.remote_status, err.retryable) == (IMAGES_MISSING, 409, True)
    elided = [im for r in DOC["images"]["requests"] for im in r["decoded"]["images"] if "data" not in im]
    assert elided and elided[0]["sha256"] in err.message


@pytest.mark.parametrize("v", DOC["images"]["invalid"], ids=lambda v: v["name"])
def test_malformed_images_are_refused_naming_the_field(v):
    with pytest.raises(InvalidRequest) as info:
        GenerationRequest.from_wire(from_json(v["decoded"]))
    assert info.value.param == v["param"]
