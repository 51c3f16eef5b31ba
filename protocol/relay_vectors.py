"""Vectors for the relay protocol (protocol/README.md section 11.7): imported by generate_vectors.py."""

from __future__ import annotations

from typing import Any

from nacl.signing import SigningKey

from hydra_node.codec import cbor
from hydra_node.codec.framing import encode_message
from hydra_node.mesh.link.dialback import dialback_proof
from hydra_node.mesh.relay.messages import RelayProtocolError, ReplyDecoder, encode_relayed_frame, encode_reply
from hydra_node.mesh.relay.punch import (
    PunchDecoder,
    PunchProtocolError,
    encode_punch,
    parse_addr,
    punch_header,
    sync_delay_s,
    websocket_client,
)
from hydra_node.mesh.wire.ids import node_id_from_public_key

SEED = bytes([0xA1]) * 32
NONCE = bytes(range(16))
SEED_OTHER = bytes([0xB2]) * 32


def _error(wire: bytes, expected: str) -> str | None:
    dec = ReplyDecoder()
    dec.receive_data(wire)
    try:
        return "incomplete" if dec.next_reply(expected) is None else None
    except RelayProtocolError as exc:
        return exc.code


def _punch_error(wire: bytes, expected: str) -> str | None:
    dec = PunchDecoder()
    dec.receive_data(wire)
    try:
        return "incomplete" if dec.next_frame(expected) is None else None
    except PunchProtocolError as exc:
        return exc.code


def _addr_error(text: Any) -> str | None:
    try:
        parse_addr(text)
    except PunchProtocolError as exc:
        return exc.code
    return None


def punch_vectors(to_json: Any) -> dict[str, Any]:
    """Hole punching (section 11.7, "Hole punching"): header, frames, addresses, the role rule."""
    frames = [
        ("punch", encode_punch("punch", addr="10.77.0.22:41000"), "punch"),
        ("punch over IPv6", encode_punch("punch", addr="[2001:db8::7]:41000"), "punch"),
        ("refused", encode_punch("refused", code="disabled", message="this node does not hole-punch"), "punch"),
        ("sync", encode_punch("sync"), "sync"),
    ]
    invalid = [
        ("sync where punch is due", encode_punch("sync"), "punch"),
        ("a refusal where sync is due", encode_punch("refused", code="busy", message="x"), "sync"),
        ("punch without a port", encode_message({"op": "punch", "addr": "10.77.0.22"}, limit=1024), "punch"),
        ("frame over 1 KiB", b"\x00\x00\x04\x01", "punch"),
    ]
    ids = sorted(node_id_from_public_key(bytes(SigningKey(s).verify_key)) for s in (SEED, SEED_OTHER))
    return {
        "header": punch_header("10.77.0.21:40000"),
        "valid": [
            {"name": n, "hex": w.hex(), "expect": e, "decoded": to_json(cbor.decode(w[4:]))} for n, w, e in frames
        ],
        "invalid": [{"name": n, "hex": w.hex(), "expect": e, "error": _punch_error(w, e)} for n, w, e in invalid],
        "addresses": {
            "valid": ["10.77.0.21:40000", "[2001:db8::1]:1"],
            "invalid": [
                {"text": t, "error": _addr_error(t)}
                for t in (
                    "10.77.0.21",
                    "10.77.0.21:0",
                    "host.example:80",
                    "2001:db8::1:80",
                    "[10.0.0.1]:80",
                    "0.0.0.0:80",
                )
            ],
        },
        "roles": {
            "smaller": ids[0],
            "larger": ids[1],
            "websocket_client": ids[0] if websocket_client(*ids) else ids[1],
        },
        "sync_delay_s": [{"rtt_s": r, "delay_s": sync_delay_s(r)} for r in (0.04, 1.0, 10.0)],
    }


def relay_vectors(to_json: Any) -> dict[str, Any]:
    valid = [
        ("reserved", encode_reply("reserved", ttl_s=3600, bytes_per_s=4_000_000, circuits=16), "reserved"),
        ("connected", encode_reply("connected"), "connected"),
        ("connected with the observed address", encode_reply("connected", observed="10.77.0.21"), "connected"),
        (
            "connected with both ends' observed addresses",
            encode_reply("connected", observed="10.77.0.21", peer_observed="10.77.0.22"),
            "connected",
        ),
        ("accepted", encode_reply("accepted"), "accepted"),
        (
            "refused",
            encode_reply("refused", code="no_reservation", message="no reservation at this relay"),
            "connected",
        ),
        ("dialback", encode_reply("dialback", results={"10.0.0.2:9338": False, "203.0.113.7:9338": True}), "dialback"),
    ]
    invalid = [
        ("wrong reply for the step", encode_reply("connected"), "reserved"),
        ("observed not an IP address", encode_reply("connected", observed="10.77.0.21:9338"), "connected"),
        ("peer_observed not an IP address", encode_reply("connected", peer_observed="host.example"), "connected"),
        ("negative ttl", encode_reply("reserved", ttl_s=-1, bytes_per_s=1, circuits=1), "reserved"),
        ("refusal without a text code", encode_reply("refused", code=7, message="x"), "accepted"),
        ("dialback result not a bool", encode_reply("dialback", results={"h:1": 1}), "dialback"),
        ("frame over 4 KiB", b"\x00\x00\x10\x01", "connected"),
        ("body not a map with op", b"\x00\x00\x00\x01\x01", "connected"),
    ]
    key = SigningKey(SEED)
    proof = dialback_proof(key, NONCE)
    return {
        "description": "relay replies (length-prefixed canonical CBOR, at most 4096 bytes), a relayed frame, "
        "and a dial-back proof (protocol/README.md section 11.7); 'expect' is the reply due",
        "valid": [
            {"name": n, "hex": w.hex(), "expect": e, "decoded": to_json(cbor.decode(w[4:]))} for n, w, e in valid
        ],
        "invalid": [{"name": n, "hex": w.hex(), "expect": e, "error": _error(w, e)} for n, w, e in invalid],
        "relayed_frame": {
            "payload": {"bytes": b"\x01\x02\x03".hex()},
            "hex": encode_relayed_frame(b"\x01\x02\x03").hex(),
        },
        "dialback_proof": {
            "seed": {"bytes": SEED.hex()},
            "node": bytes(key.verify_key).hex(),
            "nonce": {"bytes": NONCE.hex()},
            "path": "/hydra/dialback/" + NONCE.hex(),
            "signing_input": {"bytes": (b"hydra-dialback-v1" + NONCE).hex()},
            "hex": proof.hex(),
            "decoded": to_json(cbor.decode(proof)),
        },
        "incoming_header": {
            "kind": "relay_incoming",
            "v": 1,
            "from": node_id_from_public_key(bytes(key.verify_key)),
            "observed": "10.77.0.22",
            "peer_observed": "10.77.0.21",
        },
        "hole_punch": punch_vectors(to_json),
    }
