"""Management routes for invites (docs/api.md, docs/security.md "Invites"):

* ``POST /api/invite`` ``{"ttl_s": S?, "uses": N?}`` → 200 ``{"token", "id", "mesh_id", "expires_at",
  "uses", "addresses"}``; 400 for a bad ``ttl_s`` (60 s to 30 days) or ``uses`` (1..1000); 503
  when the node is not in a mesh. A token with ``uses`` admits at most that many joiners, and only
  through this node (its issuer).
* ``GET /api/invites`` → 200 ``{"invites": [{"id", "issued_at", "expires_at", "uses", "used",
  "state"}, ...]}``: the unexpired invites this node issued (state valid, used_up or revoked).
* ``POST /api/invite/revoke`` ``{"token": TOKEN_OR_ID}`` → 200 ``{"revoked": record}``; 404 for an
  id this node did not issue (403 for another node's token), 409 when the revocation list is full,
  400 for a malformed request (``admin/body.py``). The node signs a new revocation
  list and sends it to every member, which then refuses the token too.

The routes take the mesh through :class:`InviteIssuer` (``MeshService`` satisfies it).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from hydra_node.http.server import Request, Response
from hydra_node.admin.body import guarded, json_body
from hydra_node.admin.management import Handler
from hydra_node.api.errors import ApiError
from hydra_node.mesh.invites import InviteBookError, InviteRecord
from hydra_node.mesh.wire.token import MAX_INVITE_USES, parse_invite

__all__ = ["MAX_BODY_BYTES", "MAX_INVITE_TTL_S", "MIN_INVITE_TTL_S", "InviteIssuer", "invite_routes"]

#: Shortest and longest invite lifetime a caller may ask for.
MIN_INVITE_TTL_S = 60.0
MAX_INVITE_TTL_S = 30 * 24 * 3600.0
#: Longest accepted body (a token of at most 4096 characters).
MAX_BODY_BYTES = 16 * 1024


class InviteIssuer(Protocol):
    """What the invite routes need of the mesh (``MeshService`` satisfies it; ``invites`` is its
    :class:`hydra_node.mesh.invite_relay.InviteService`)."""

    @property
    def joined(self) -> bool: ...

    @property
    def invite_ttl_s(self) -> float: ...

    @property
    def invites(self) -> Any: ...

    def invite(self, ttl_s: float, uses: int | None = None) -> str: ...


def _record_json(rec: InviteRecord, now: float) -> dict:
    return {
        "id": rec.id,
        "issued_at": rec.issued_at,
        "expires_at": rec.expires_at,
        "uses": rec.uses,
        "used": rec.used,
        "state": rec.state(now),
    }


def _joined(mesh: InviteIssuer | None) -> InviteIssuer:
    if mesh is None or not mesh.joined:
        raise ApiError(503, "this node is not in a mesh", "no_mesh")
    return mesh


def invite_routes(mesh: InviteIssuer | None) -> dict[tuple[str, str], Handler]:
    """Every invite route (the root adds them to the management table) over ``mesh`` (None: a node
    without a mesh, always 503)."""

    async def invite(request: Request) -> Response:
        issuer = _joined(mesh)
        body = json_body(request, optional={"ttl_s": (int, float), "uses": int}, max_bytes=MAX_BODY_BYTES)
        ttl = body.get("ttl_s", issuer.invite_ttl_s)
        if not MIN_INVITE_TTL_S <= ttl <= MAX_INVITE_TTL_S:
            raise ApiError(
                400, "ttl_s must be a number of seconds between 60 and 2592000 (30 days)", "invalid_value", "ttl_s"
            )
        uses = body.get("uses")
        if uses is not None and not 1 <= uses <= MAX_INVITE_USES:
            raise ApiError(
                400, f"uses must be an integer 1..{MAX_INVITE_USES} (or absent: no limit)", "invalid_value", "uses"
            )
        try:
            token = issuer.invite(float(ttl), uses)
        except InviteBookError as exc:
            return ApiError(409 if exc.code == "too_many" else 500, str(exc), f"invite_{exc.code}").response()
        except OSError as exc:
            return ApiError(500, f"cannot record the invite: {exc}", "invite_unwritable").response()
        tok = parse_invite(token, time.time())
        return Response.json(
            200,
            {
                "token": token,
                "id": tok.token_id,
                "mesh_id": tok.mesh_id,
                "expires_at": tok.expires_at,
                "uses": tok.uses,
                "addresses": list(tok.addrs),
            },
        )

    async def listing(request: Request) -> Response:
        now = time.time()
        try:
            records = _joined(mesh).invites.records()
        except InviteBookError as exc:
            return ApiError(500, str(exc), f"invite_{exc.code}").response()
        return Response.json(200, {"invites": [_record_json(r, now) for r in records]})

    async def revoke(request: Request) -> Response:
        issuer = _joined(mesh)
        target = json_body(request, required={"token": str}, max_bytes=MAX_BODY_BYTES)["token"]
        if not target.strip() or len(target) > 4096:
            raise ApiError(400, "token must be an invite token or its id", "invalid_value", "token")
        try:
            rec = issuer.invites.revoke(target)
        except OSError as exc:
            return ApiError(500, f"cannot record the revocation: {exc}", "invite_unwritable").response()
        except InviteBookError as exc:
            status = {"not_found": 404, "not_ours": 403, "bad_token": 400, "too_many": 409}.get(exc.code, 500)
            return ApiError(status, str(exc), f"invite_{exc.code}", "token").response()
        return Response.json(200, {"revoked": _record_json(rec, time.time())})

    return guarded(
        {("POST", "/api/invite"): invite, ("GET", "/api/invites"): listing, ("POST", "/api/invite/revoke"): revoke}
    )
