"""Which handler serves a stream a peer opens (pure): by the header's ``kind``, and ``tunnel`` streams
by their ``service`` name. The table is declared by the composition root, never by a service."""

from __future__ import annotations

from typing import Any, Mapping

from hydra_node.mesh.link.settings import StreamHandler

__all__ = ["StreamHandler", "StreamRoutes", "TUNNEL_KIND"]

#: Streams of this kind are routed by their header's ``service`` (llama.cpp RPC, draft server ...).
TUNNEL_KIND = "tunnel"


class StreamRoutes:
    def __init__(self) -> None:
        self._kinds: dict[str, StreamHandler] = {}
        self._tunnels: dict[str, StreamHandler] = {}

    def add_kind(self, kind: str, handler: StreamHandler) -> None:
        if kind == TUNNEL_KIND:
            raise ValueError("tunnel streams are declared by service name: use add_tunnel")
        self._kinds[kind] = handler

    def add_tunnel(self, service: str, handler: StreamHandler) -> None:
        self._tunnels[service] = handler

    def handler_for(self, header: Mapping[str, Any]) -> StreamHandler | None:
        """The handler for a stream with ``header`` (untrusted: anything unknown or malformed is None)."""
        kind = header.get("kind")
        if not isinstance(kind, str):
            return None
        if kind == TUNNEL_KIND:
            service = header.get("service")
            return self._tunnels.get(service) if isinstance(service, str) else None
        return self._kinds.get(kind)
