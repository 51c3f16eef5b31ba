"""The mesh key file (``HOME/mesh/mesh.key``): hex of the 32-byte mesh key, mode 0600.

Whoever holds the key is a member of the mesh; the file is refused if other users can read it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hydra_node.mesh.wire.errors import MeshError
from hydra_node.mesh.wire.ids import MESH_KEY_BYTES, MeshSecret

__all__ = ["load_mesh_key", "mesh_key_path", "save_mesh_key"]


def mesh_key_path(home: Path) -> Path:
    return home / "mesh" / "mesh.key"


def load_mesh_key(path: Path) -> MeshSecret | None:
    """The key held in ``path``, None when there is no file; MeshError when it is exposed or corrupt."""
    if not path.exists():
        return None
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise MeshError(f"{path} is readable by other users; run: chmod 600 {path}")
    try:
        key = bytes.fromhex(path.read_text().strip())
        if len(key) != MESH_KEY_BYTES:
            raise ValueError("wrong length")
    except ValueError as exc:
        raise MeshError(f"{path} is corrupt ({exc}); remove it to start a new mesh") from None
    return MeshSecret(key)


def save_mesh_key(path: Path, mesh: MeshSecret) -> None:
    """Write the key atomically, created 0600 (never readable by others, not even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(mesh.mesh_key.hex() + "\n")
    os.replace(tmp, path)
