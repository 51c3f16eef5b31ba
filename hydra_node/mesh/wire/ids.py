"""Node ids and mesh ids.

* Node id: lowercase hex of the node's 32-byte Ed25519 public key (64 characters),
  the same form upstream Mesh LLM uses. It is reversible, so a node id is enough to
  verify a signature.
* Mesh id: lowercase hex of the first 16 bytes of
  BLAKE2b-256(key=mesh_key, person=b"hydra-mesh-id") (32 characters). A mesh is
  defined by its random 32-byte mesh key; the id can be published freely, and a
  node that receives a mesh key can check it against the id it was invited to.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field

from hydra_node.mesh.wire.errors import LocalProtocolError

PUBLIC_KEY_BYTES = 32
MESH_KEY_BYTES = 32
NODE_ID_CHARS = 64
MESH_ID_CHARS = 32
_HEX = frozenset("0123456789abcdef")


def node_id_from_public_key(public_key: bytes) -> str:
    """The node id of an Ed25519 public key: 64 lowercase hex characters."""
    if not isinstance(public_key, (bytes, bytearray)) or len(public_key) != PUBLIC_KEY_BYTES:
        raise LocalProtocolError("an Ed25519 public key is exactly 32 bytes")
    return bytes(public_key).hex()


def public_key_from_node_id(node_id: str) -> bytes:
    """Inverse of node_id_from_public_key; ValueError if `node_id` is not one."""
    if not is_node_id(node_id):
        raise ValueError(f"not a node id (64 lowercase hex characters): {node_id!r}")
    return bytes.fromhex(node_id)


def is_node_id(text: object) -> bool:
    return isinstance(text, str) and len(text) == NODE_ID_CHARS and set(text) <= _HEX


def is_mesh_id(text: object) -> bool:
    return isinstance(text, str) and len(text) == MESH_ID_CHARS and set(text) <= _HEX


def mesh_id_from_key(mesh_key: bytes) -> str:
    """The public mesh id derived from a 32-byte mesh key."""
    if not isinstance(mesh_key, (bytes, bytearray)) or len(mesh_key) != MESH_KEY_BYTES:
        raise LocalProtocolError("a mesh key is exactly 32 bytes")
    digest = hashlib.blake2b(b"", key=bytes(mesh_key), person=b"hydra-mesh-id", digest_size=32).digest()
    return digest[:16].hex()


@dataclass(frozen=True)
class MeshSecret:
    """Membership of one mesh: its random key and the id derived from it."""

    mesh_key: bytes = field(repr=False)
    mesh_id: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mesh_id", mesh_id_from_key(self.mesh_key))

    @classmethod
    def generate(cls) -> MeshSecret:
        """A brand-new mesh."""
        return cls(os.urandom(MESH_KEY_BYTES))

    def mac(self, label: bytes, data: bytes) -> bytes:
        """Keyed BLAKE2b-256 proof of knowing the mesh key, domain-separated by `label`."""
        return hashlib.blake2b(label + b"\x00" + data, key=self.mesh_key, digest_size=32).digest()

    def check_mac(self, label: bytes, data: bytes, mac: bytes) -> bool:
        return hmac.compare_digest(self.mac(label, data), mac)
