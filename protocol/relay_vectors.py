"""Vectors for the relay protocol (protocol/README.md section 11.7): imported by generate_vectors.py."""

from __future__ import annotations

from typing import Any

from nacl.signing import SigningKey

from hydra_node.codec import cbor
from hydra_node.mesh.link.dialback import dialback_proof
from hydra_node.mesh.relay.messages import RelayProtocolError, ReplyDecoder, encode_relayed_frame, encode_reply

SEED = bytes([0xA1]) * 32
NONCE = bytes(range(16))


def _error(wire: bytes, expected: str) -> str | None:
    dec = ReplyDecoder()
    dec.receive_data(wire)
    try:
        return "incomplete" if dec.next_reply(expected) is None else None
    except RelayProtocolError as exc:
        return exc.code


def relay_vectors(to_json: Any) -> dict[str, Any]:
    valid = [
        ("reserved", encode_reply("reserved", ttl_s=3600, bytes_per_s=4_000_000, circuits=16), "reserved"),
        ("connected", encode_reply("connected"), "connected"),
        ("accepted", encode_reply("accepted"), "accepted"),
        ("refused", encode_reply("refused", code="no_reservation", message="no reservation at this relay"), "connected"),
        ("dialback", encode_reply("dialback", results={"10.0.0.2:9338": False, "203.0.113.7:9338": True}), "dialback"),
    ]
    invalid = [
        ("wrong reply for the step", encode_reply("connected"), "reserved"),
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
        "valid": [{"name": n, "hex": w.hex(), "expect": e, "decoded": to_json(cbor.decode(w[4:]))} for n, w, e in valid],
        "invalid": [{"name": n, "hex": w.hex(), "expect": e, "error": _error(w, e)} for n, w, e in invalid],
        "relayed_frame": {"payload": {"bytes": b"\x01\x02\x03".hex()}, "hex": encode_relayed_frame(b"\x01\x02\x03").hex()},
        "dialback_proof": {"seed": {"bytes": SEED.hex()}, "node": bytes(key.verify_key).hex(),
                           "nonce": {"bytes": NONCE.hex()}, "path": "/hydra/dialback/" + NONCE.hex(),
                           "signing_input": {"bytes": (b"hydra-dialback-v1" + NONCE).hex()},
                           "hex": proof.hex(), "decoded": to_json(cbor.decode(proof))},
    }
