"""protocol/vectors/*.json hold against the code, and match a fresh run of the generator."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from hydra_node.mesh.wire import cbor
from hydra_node.mesh.wire.secure_channel import SecureChannel
from hydra_node.mesh.wire.envelope import open_envelope
from hydra_node.mesh.wire.errors import CborError, EnvelopeError, FrameRejected, HandshakeError, MeshError
from hydra_node.mesh.wire.frames import KIND, decode_frame, encode_frame
from hydra_node.mesh.wire.token import parse_invite
from vector_json import from_json

PROTOCOL = Path(__file__).resolve().parents[3] / "protocol"
VECTORS = PROTOCOL / "vectors"


def load(name: str) -> dict[str, Any]:
    return json.loads((VECTORS / name).read_text())


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("generate_vectors", PROTOCOL / "generate_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_generator_reproduces_the_checked_in_files() -> None:
    module = _generator()
    for name, doc in module.build_all().items():
        assert (VECTORS / name).read_text() == module.render(doc), f"{name} is stale: run protocol/generate_vectors.py"


@pytest.mark.parametrize("vector", load("cbor.json")["valid"], ids=lambda v: v["name"])
def test_cbor_valid(vector: dict[str, Any]) -> None:
    value = from_json(vector["decoded"])
    assert cbor.encode(value).hex() == vector["hex"]
    assert cbor.decode(bytes.fromhex(vector["hex"])) == value


@pytest.mark.parametrize("vector", load("cbor.json")["invalid"], ids=lambda v: v["name"])
def test_cbor_invalid(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    with pytest.raises(CborError) as info:
        cbor.decode(data)
    assert info.value.code == vector["error"]


def test_envelopes() -> None:
    doc = load("envelope.json")
    key = SigningKey(bytes.fromhex(doc["signer_seed"]))
    for vector in doc["valid"]:
        env = open_envelope(bytes.fromhex(vector["hex"]), context=vector["context"])
        assert env.body == from_json(vector["body"]) and env.signer_id == doc["signer_id"]
        signed = bytes.fromhex(vector["signing_input_hex"])
        key.verify_key.verify(signed, cbor.decode(bytes.fromhex(vector["hex"]))["sig"])
    for vector in doc["invalid"]:
        with pytest.raises(EnvelopeError) as info:
            open_envelope(bytes.fromhex(vector["hex"]), context=vector["context"])
        assert info.value.code == vector["error"], vector["name"]


@pytest.mark.parametrize("case", load("token.json")["cases"], ids=lambda c: c["name"])
def test_tokens(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(MeshError) as info:
            parse_invite(case["token"], case["now"], expected_mesh_id=case["expected_mesh_id"])
        assert info.value.code == case["error"]
    else:
        token = parse_invite(case["token"], case["now"], expected_mesh_id=case["expected_mesh_id"])
        assert case["parsed"] == {
            "mesh_id": token.mesh_id,
            "issuer_id": token.issuer_id,
            "addrs": list(token.addrs),
            "expires_at": token.expires_at,
            "nonce": token.nonce.hex(),
        }


def test_frames() -> None:
    doc = load("frames.json")
    for vector in doc["valid"]:
        frame = decode_frame(bytes.fromhex(vector["hex"]))
        assert type(frame).__name__ == vector["kind"] and KIND[type(frame)] == int(vector["hex"][:2], 16)
        assert encode_frame(frame).hex() == vector["hex"]
    for vector in doc["invalid"]:
        with pytest.raises(FrameRejected) as info:
            decode_frame(bytes.fromhex(vector["hex"]))
        assert info.value.code == vector["error"], vector["name"]


def test_channel() -> None:
    doc = load("channel.json")
    send_key, receive_key = bytes.fromhex(doc["send_key"]), bytes.fromhex(doc["receive_key"])
    sender = SecureChannel(send_key, receive_key)
    for vector in doc["frames"]:
        assert sender.seal(bytes.fromhex(vector["plaintext"])).hex() == vector["hex"]
    receiver = SecureChannel(receive_key, send_key)
    for step in doc["receiver_story"]:
        if step["result"] == "ok":
            receiver.open(bytes.fromhex(step["hex"]))
        else:
            with pytest.raises(FrameRejected) as info:
                receiver.open(bytes.fromhex(step["hex"]))
            assert info.value.code == step["result"]


HANDSHAKE = load("handshake.json")


@pytest.mark.parametrize("story", HANDSHAKE["stories"], ids=lambda s: s["name"])
def test_handshake_stories(story: dict[str, Any]) -> None:
    """Rebuild both cores from the story's setup and replay: every message and error must match."""
    initiator, responder = _generator().build_story_parties(story["setup"])
    parties = {"initiator": initiator, "responder": responder}
    messages = story["messages"]
    if "first" not in story["setup"]:
        assert initiator.initiate().hex() == messages[0]["hex"]
    errors: dict[str, str] = {}
    for index, message in enumerate(messages):
        receiver = "responder" if message["from"] == "initiator" else "initiator"
        try:
            out = parties[receiver].receive(bytes.fromhex(message["hex"]))
        except HandshakeError as exc:
            errors[receiver] = exc.code
            out = exc.reply
        if out is not None:
            assert messages[index + 1] == {"from": receiver, "hex": out.hex()}
        else:
            assert index + 1 == len(messages) or messages[index + 1]["from"] != receiver
    expected = {e["side"]: e["code"] for e in (story.get("error"), story.get("peer_error")) if e}
    assert errors == expected
    if "result" in story:
        result = story["result"]
        assert initiator.result.session_id.hex() == responder.result.session_id.hex() == result["session_id"]
        assert initiator.result.send_key.hex() == result["initiator_send_key"]
        assert responder.result.send_key.hex() == result["responder_send_key"]
        assert (
            initiator.result.peer_id == result["initiator_sees"]
            and responder.result.peer_id == result["responder_sees"]
        )
        assert initiator.result.mesh.mesh_id == result["mesh_id"]


# ---- signed announcements and gossip messages (protocol/README.md section 11) --------------


def test_announcement_vectors():
    from hydra_node.mesh.membership.signing import _unsigned_bytes, verify_announcement
    from hydra_node.mesh.membership import Announcement

    doc = load("announce.json")
    for v in doc["valid"]:
        ann = Announcement.from_wire(from_json(v["wire"]))
        assert verify_announcement(ann), v["name"]
        assert _unsigned_bytes(ann) == from_json(v["signing_input"])
        assert dict(ann.extra)["sig"] == from_json(v["signature"])
    for v in doc["invalid"]:
        assert not verify_announcement(Announcement.from_wire(from_json(v["wire"]))), v["name"]
    for v in doc["messages"]:
        assert cbor.encode(from_json(v["decoded"])).hex() == v["hex"]
        assert cbor.decode(bytes.fromhex(v["hex"])) == from_json(v["decoded"])
