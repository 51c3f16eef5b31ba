"""What the runtime sees of the mesh: a narrow, read-mostly view (``MeshService`` satisfies it).

The runtime (hosting, RPC tunnels, speculative drafts) needs the members' announcements, their
membership states, the measured RTT of an open link, and a link to open streams on.  It gets
exactly that from the composition root (``hydra_node/node.py``), never the whole mesh service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["LinkView", "PeerView", "link_rtt_ms"]


class LinkView(Protocol):
    """An open peer link, as far as the runtime looks at it."""

    @property
    def peer_id(self) -> str: ...

    @property
    def rtt_ms(self) -> float | None: ...

    def open_stream(self, header: dict) -> Any: ...


class PeerView(Protocol):
    """The mesh as the runtime uses it (see the module docstring)."""

    @property
    def listen_host(self) -> str: ...

    def members(self) -> Mapping[str, Any]: ...

    def member_states(self, now: float) -> Mapping[str, str]: ...

    def link(self, peer_id: str) -> LinkView | None: ...

    async def link_to(self, peer_id: str) -> Any: ...


def link_rtt_ms(mesh: PeerView, peer_id: str) -> float | None:
    """The measured RTT of the open link to ``peer_id`` (None: no link, or not measured yet)."""
    link = mesh.link(peer_id)
    return None if link is None else link.rtt_ms
