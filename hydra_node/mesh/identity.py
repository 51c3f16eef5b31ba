"""The node's Ed25519 identity, stored under ``HOME/identity/node.key`` (mode 0600).

The file holds the 32-byte seed, hex-encoded on one line.  The node id is derived
from the public key (see ``docs/protocol.md``: lowercase hex of the first 16 bytes
of BLAKE2b-256 over the public key, 32 characters).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import nacl.signing

from hydra_node.mesh.wire.ids import node_id_from_public_key


class IdentityError(Exception):
    """The identity file is unusable (corrupt or readable by others)."""


@dataclass(frozen=True)
class Identity:
    signing_key: nacl.signing.SigningKey

    @property
    def public_key(self) -> bytes:
        return bytes(self.signing_key.verify_key)

    @property
    def node_id(self) -> str:
        return node_id_from_public_key(self.public_key)


def load_or_create_identity(home: Path) -> Identity:
    path = home / "identity" / "node.key"
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise IdentityError(f"{path} is readable by other users (mode {mode:o}); run: chmod 600 {path}")
        try:
            seed = bytes.fromhex(path.read_text().strip())
            if len(seed) != 32:
                raise ValueError("wrong length")
        except ValueError as exc:
            raise IdentityError(f"{path} is corrupt ({exc}); move it away to create a new identity") from None
        return Identity(nacl.signing.SigningKey(seed))
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    key = nacl.signing.SigningKey.generate()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(bytes(key).hex() + "\n")
    os.replace(tmp, path)
    return Identity(key)
