"""Announcements are signed by the node they describe, so relayed gossip cannot be forged.

The signature is Ed25519 over ``signing_input("announce", cbor(wire without extra.sig))``
(see protocol/README.md "Signed announcements").  The node id *is* the public key,
so any member verifies a relayed announcement without a key lookup.
"""

from __future__ import annotations

import dataclasses

import nacl.exceptions
import nacl.signing

from hydra_node.mesh.wire.cbor import encode
from hydra_node.mesh.wire.envelope import signing_input
from hydra_node.mesh.wire.ids import public_key_from_node_id
from hydra_node.mesh.membership import Announcement

SIG_KEY = "sig"
CONTEXT = "announce"


def _unsigned_bytes(ann: Announcement) -> bytes:
    wire = ann.to_wire()
    wire["extra"] = {k: v for k, v in wire["extra"].items() if k != SIG_KEY}
    return signing_input(CONTEXT, encode(wire))


def sign_announcement(key: nacl.signing.SigningKey, ann: Announcement) -> Announcement:
    extra = {k: v for k, v in dict(ann.extra).items() if k != SIG_KEY}
    unsigned = dataclasses.replace(ann, extra=extra)
    sig = key.sign(_unsigned_bytes(unsigned)).signature
    return dataclasses.replace(ann, extra={**extra, SIG_KEY: sig})


def verify_announcement(ann: Announcement) -> bool:
    sig = dict(ann.extra).get(SIG_KEY)
    if not isinstance(sig, bytes) or len(sig) != 64:
        return False
    try:
        vk = nacl.signing.VerifyKey(public_key_from_node_id(ann.node_id))
        vk.verify(_unsigned_bytes(ann), sig)
        return True
    except (nacl.exceptions.BadSignatureError, ValueError, Exception):
        return False
