"""Management route for invites: ``POST /api/invite`` ``{"ttl_s": S?}`` → a new invite token.

200 ``{"token", "mesh_id", "expires_at", "addresses"}``; 503 when the node is not in a mesh;
400 for a bad ``ttl_s`` (60 s to 30 days).  The route takes the mesh through :class:`InviteIssuer`.
"""

from __future__ import annotations

import time
from typing import Protocol

from hydra_node.api.http import Request, Response
from hydra_node.api.management import Handler
from hydra_node.api.openai import ApiError
from hydra_node.mesh.wire.token import parse_invite

__all__ = ["MAX_INVITE_TTL_S", "MIN_INVITE_TTL_S", "InviteIssuer", "invite_route"]

#: Shortest and longest invite lifetime a caller may ask for.
MIN_INVITE_TTL_S = 60.0
MAX_INVITE_TTL_S = 30 * 24 * 3600.0


class InviteIssuer(Protocol):
    """What the invite route needs of the mesh (``MeshService`` satisfies it)."""

    @property
    def joined(self) -> bool: ...

    @property
    def invite_ttl_s(self) -> float: ...

    def invite(self, ttl_s: float) -> str: ...


def invite_route(mesh: InviteIssuer | None) -> Handler:
    """The ``POST /api/invite`` handler over ``mesh`` (None: a node without a mesh, always 503)."""

    async def invite(request: Request) -> Response:
        if mesh is None or not mesh.joined:
            return ApiError(503, "this node is not in a mesh", "no_mesh").response()
        try:
            body = request.json() if request.body else {}
            ttl = float(body.get("ttl_s", mesh.invite_ttl_s))
            if not (MIN_INVITE_TTL_S <= ttl <= MAX_INVITE_TTL_S):
                raise ValueError("ttl_s must be between 60 s and 30 days")
        except (ValueError, TypeError, AttributeError) as exc:
            return ApiError(400, f"bad invite request: {exc}", "invalid_value", "ttl_s").response()
        token = mesh.invite(ttl)
        tok = parse_invite(token, time.time())
        return Response.json(200, {"token": token, "mesh_id": tok.mesh_id, "expires_at": tok.expires_at,
                                   "addresses": list(tok.addrs)})

    return invite
