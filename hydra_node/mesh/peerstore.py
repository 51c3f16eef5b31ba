"""Remembered peers (``HOME/mesh/peers.json``): the addresses of the members we knew, so a restart
without ``--join`` finds the mesh again.

The file is ``{"mesh_id": ..., "peers": {node id: [address, ...]}}``; it is rewritten only when the
addresses change (announcements change often, queue depth for one), and read back for our own mesh only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from hydra_node.mesh.wire.errors import TokenError
from hydra_node.mesh.joining import DialCandidate
from hydra_node.mesh.membership import Announcement
from hydra_node.mesh.wire.token import addr_to_url

__all__ = [
    "MAX_ADDRESSES_PER_PEER",
    "MAX_REMEMBERED_PEERS",
    "PeerStore",
    "remembered_candidates",
    "remembered_document",
]

#: Peers whose addresses are remembered (the file stays small and a restart dials a bounded number).
MAX_REMEMBERED_PEERS = 64
#: Addresses of one peer that are tried on a restart (an announcement carries a few at most).
MAX_ADDRESSES_PER_PEER = 8


def remembered_document(mesh_id: str, members: Mapping[str, Announcement | None]) -> dict | None:
    """What to write for these members (None when none has an address worth remembering)."""
    known = {pid: list(ann.addresses) for pid, ann in members.items() if ann is not None and ann.addresses}
    if not known:
        return None
    return {"mesh_id": mesh_id, "peers": dict(sorted(known.items())[:MAX_REMEMBERED_PEERS])}


def remembered_candidates(data: Any, mesh_id: str) -> list[DialCandidate]:
    """The peers of ``mesh_id`` in a parsed file; anything malformed or of another mesh is skipped."""
    if not isinstance(data, dict) or data.get("mesh_id") != mesh_id or not isinstance(data.get("peers"), dict):
        return []
    out = []
    for pid, addrs in list(data["peers"].items())[:MAX_REMEMBERED_PEERS]:
        if not isinstance(pid, str) or not isinstance(addrs, list) or not addrs:
            continue
        try:
            urls = tuple(addr_to_url(str(a)) for a in addrs[:MAX_ADDRESSES_PER_PEER])
        except (TokenError, ValueError):
            continue
        out.append(DialCandidate(urls, pid))
    return out


class PeerStore:
    """Reads and writes the remembered-peers file at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: dict | None = None

    def remember(self, mesh_id: str, members: Mapping[str, Announcement | None]) -> bool:
        """Write the members' addresses if they changed since the last write; True when written."""
        data = remembered_document(mesh_id, members)
        if data is None or data == self._written:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)
        self._written = data
        return True

    def candidates(self, mesh_id: str) -> list[DialCandidate]:
        """The remembered peers of ``mesh_id`` (empty without a readable file)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []
        return remembered_candidates(data, mesh_id)
