"""protocol/vectors/relay.json holds against the code (its freshness is checked by test_vectors.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from hydra_node.codec import cbor
from hydra_node.mesh.link.dialback import check_dialback_proof, dialback_proof, nonce_from_path
from hydra_node.mesh.relay.messages import RelayProtocolError, ReplyDecoder, relayed_frame_decoder
from vector_json import from_json

DOC = json.loads((Path(__file__).resolve().parents[3] / "protocol" / "vectors" / "relay.json").read_text())


@pytest.mark.parametrize("v", DOC["valid"], ids=lambda v: v["name"])
def test_valid_replies(v) -> None:
    dec = ReplyDecoder()
    dec.receive_data(bytes.fromhex(v["hex"]) + b"after")
    assert dec.next_reply(v["expect"]) == from_json(v["decoded"])
    assert dec.take_unconsumed() == b"after"
    assert cbor.encode(from_json(v["decoded"])) == bytes.fromhex(v["hex"])[4:]


@pytest.mark.parametrize("v", DOC["invalid"], ids=lambda v: v["name"])
def test_invalid_replies(v) -> None:
    dec = ReplyDecoder()
    dec.receive_data(bytes.fromhex(v["hex"]))
    with pytest.raises(RelayProtocolError) as err:
        dec.next_reply(v["expect"])
    assert err.value.code == v["error"]


def test_relayed_frame_and_dialback_proof() -> None:
    dec = relayed_frame_decoder()
    dec.receive_data(bytes.fromhex(DOC["relayed_frame"]["hex"]))
    assert dec.next_frame() == from_json(DOC["relayed_frame"]["payload"])
    p = DOC["dialback_proof"]
    key, nonce = SigningKey(from_json(p["seed"])), from_json(p["nonce"])
    assert dialback_proof(key, nonce).hex() == p["hex"]  # Ed25519 signatures are deterministic
    assert key.verify_key.verify(from_json(p["signing_input"]), from_json(p["decoded"])["sig"])
    assert check_dialback_proof(bytes.fromhex(p["hex"]), p["node"], nonce)
    assert nonce_from_path(p["path"]) == nonce


PUNCH = DOC["hole_punch"]


def test_incoming_header_with_the_observed_address() -> None:
    from hydra_node.mesh.relay.messages import parse_incoming

    request = parse_incoming(DOC["incoming_header"])
    h = DOC["incoming_header"]
    assert (request.source, request.observed, request.peer_observed) == (h["from"], h["observed"], h["peer_observed"])


@pytest.mark.parametrize("v", PUNCH["valid"], ids=lambda v: v["name"])
def test_valid_punch_frames(v) -> None:
    from hydra_node.mesh.relay.punch import PunchDecoder

    dec = PunchDecoder()
    dec.receive_data(bytes.fromhex(v["hex"]))
    assert dec.next_frame(v["expect"]) == from_json(v["decoded"])
    assert cbor.encode(from_json(v["decoded"])) == bytes.fromhex(v["hex"])[4:]


@pytest.mark.parametrize("v", PUNCH["invalid"], ids=lambda v: v["name"])
def test_invalid_punch_frames(v) -> None:
    from hydra_node.mesh.relay.punch import PunchDecoder, PunchProtocolError

    dec = PunchDecoder()
    dec.receive_data(bytes.fromhex(v["hex"]))
    with pytest.raises(PunchProtocolError) as err:
        dec.next_frame(v["expect"])
    assert err.value.code == v["error"]


def test_punch_header_addresses_roles_and_timing() -> None:
    from hydra_node.mesh.relay.punch import (
        PunchProtocolError,
        format_addr,
        parse_addr,
        parse_punch_header,
        sync_delay_s,
        websocket_client,
    )

    assert format_addr(*dataclass_fields(parse_punch_header(PUNCH["header"]))) == PUNCH["header"]["addr"]
    for text in PUNCH["addresses"]["valid"]:
        assert format_addr(*dataclass_fields(parse_addr(text))) == text
    for case in PUNCH["addresses"]["invalid"]:
        with pytest.raises(PunchProtocolError) as err:
            parse_addr(case["text"])
        assert err.value.code == case["error"]
    roles = PUNCH["roles"]
    assert websocket_client(roles["smaller"], roles["larger"]) and roles["websocket_client"] == roles["smaller"]
    for case in PUNCH["sync_delay_s"]:
        assert sync_delay_s(case["rtt_s"]) == case["delay_s"]


def dataclass_fields(addr) -> tuple[str, int]:
    return addr.host, addr.port
