"""Placement routes on the console port (docs/placement.md "API"); ``hydra placement`` calls them.

* ``POST /api/placement/prefetch`` ``{"kind", "name", "source", "posix_root"?, "s3_bucket"?,
  "identity"?, "vast"?, "trigger"?}`` – queue publishing the local ``source`` (an absolute path to a
  file or folder on the node's machine) into the namespace (the configured one by default): 202
  with the operation.
* ``POST /api/placement/fetch`` ``{"kind", "name"}`` – queue materialising into the local cache: 202.
* ``GET /api/placement/status/{op_id}`` (or ``?id=OP_ID``) – one operation: 200, 404.
* ``POST /api/placement/retry`` ``{"id"}`` – run a failed operation again: 202, 409 when not failed.
* ``GET /api/placement/cache`` – what the local cache holds: sizes, TTL, pins, leases.
* ``POST /api/placement/pin`` ``{"name", "kind"?, "pinned"?: true}`` – pin (or unpin) a name.
* ``POST /api/placement/evict`` ``{"name", "kind"?, "posix_root"?, "s3_bucket"?}`` – remove from the
  local cache and, with a namespace (and ``kind``), from the namespace.

Errors are OpenAI-style JSON bodies (``api/errors.py``): a bad body as every management route
answers it (``admin/body.py``), the artifact error's own status and ``code`` otherwise (404
unknown, 409 held, 429 busy, 502 corrupt, 503 store unavailable, 507 cache full).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hydra_node.http.server import Request, Response
from hydra_node.admin.body import guarded, json_body
from hydra_node.admin.management import Handler
from hydra_node.api.errors import ApiError
from hydra_node.runtime.artifacts.errors import ArtifactError
from hydra_node.runtime.artifacts.manifest import validate_kind, validate_name
from hydra_node.runtime.artifacts.service import PlacementService
from hydra_node.runtime.artifacts.settings import Namespace

__all__ = ["MAX_BODY_BYTES", "placement_routes"]

#: Longest accepted body (an identity map and VAST settings at most).
MAX_BODY_BYTES = 256 * 1024
_VAST_KEYS = ("endpoint", "tenant", "dataspace", "source_namespace", "destination_namespace", "target_site")
_NS = {"posix_root": str, "s3_bucket": str}


def _body(request: Request, *required: str, **optional: type) -> dict[str, Any]:
    """The body with the string fields ``required`` and the ``optional`` ones (name=type)."""
    return json_body(request, required=dict.fromkeys(required, str), optional=optional, max_bytes=MAX_BODY_BYTES)


def _namespace(body: Mapping[str, Any], service: PlacementService) -> Namespace | None:
    root, bucket = body.get("posix_root"), body.get("s3_bucket")
    if root and bucket:
        raise ApiError(400, "give posix_root or s3_bucket, not both", "invalid_value", "s3_bucket")
    if root:
        if not root.startswith("/"):
            raise ApiError(400, f"posix_root must be an absolute path, not {root!r}", "invalid_value", "posix_root")
        return Namespace("posix", root=root)
    if bucket:
        s = service.settings  # endpoint, region and prefix: the configured S3's
        return Namespace("s3", bucket=bucket, endpoint=s.s3_endpoint, region=s.s3_region, prefix=s.s3_prefix)
    return None


def _op(op: Any, status: int = 200) -> Response:
    """An operation's JSON, with ``done``: nothing more will happen to it unless retried."""
    return Response.json(status, {**op.to_json(), "done": op.terminal})


def placement_routes(service: PlacementService) -> dict[tuple[str, str], Handler]:
    async def prefetch(request: Request) -> Response:
        b = _body(request, "kind", "name", "source", **_NS, identity=dict, vast=dict, trigger=bool)
        identity, vast, trigger = b.get("identity", {}), b.get("vast"), b.get("trigger", True)
        if vast is not None and (set(vast) - set(_VAST_KEYS) or not isinstance(vast.get("endpoint"), str)):
            raise ApiError(
                400,
                f"vast must be an object with endpoint and optionally {', '.join(_VAST_KEYS[1:])}",
                "invalid_value",
                "vast",
            )
        _kind(b)
        if vast is not None and not trigger:
            raise ApiError(400, "vast and trigger=false exclude each other", "invalid_value", "trigger")
        op = await service.submit_publish(
            b["kind"],
            b["name"],
            b["source"],
            namespace=_namespace(b, service),
            identity=identity,
            trigger=trigger,
            vast=vast,
        )
        return _op(op, 202)

    async def fetch(request: Request) -> Response:
        b = _body(request, "kind", "name")
        _kind(b)
        return _op(await service.submit_fetch(b["kind"], b["name"]), 202)

    async def status(request: Request) -> Response:
        path = request.path.rstrip("/")
        op_id = path.rsplit("/", 1)[1] if path.startswith("/api/placement/status/") else request.query.get("id")
        if not op_id:
            raise ApiError(400, "name the operation: /api/placement/status/OP_ID or ?id=OP_ID", "invalid_value", "id")
        return _op(service.get(op_id))

    async def retry(request: Request) -> Response:
        b = _body(request, "id")
        return _op(await service.retry(b["id"]), 202)

    async def cache(request: Request) -> Response:
        return Response.json(200, service.cache_listing())

    async def pin(request: Request) -> Response:
        b = _body(request, "name", kind=str, pinned=bool)
        on = b.get("pinned", True)
        kind = _kind(b)
        try:
            covers = await service.pin(b["name"], kind, on)
        except ValueError as exc:
            raise ApiError(409, str(exc), "too_many_pins") from None
        return Response.json(200, {"name": b["name"], "kind": kind, "pinned": on, "artifacts": covers})

    async def evict(request: Request) -> Response:
        b = _body(request, "name", kind=str, **_NS)
        ns = _namespace(b, service)
        kind = _kind(b)
        if ns is not None and kind is None:
            raise ApiError(400, "evicting from a namespace needs kind", "invalid_value", "kind")
        return Response.json(200, await service.evict(b["name"], kind, ns))

    return guarded(
        {
            ("POST", "/api/placement/prefetch"): prefetch,
            ("POST", "/api/placement/fetch"): fetch,
            ("GET", "/api/placement/status"): status,
            ("GET", "/api/placement/status/*"): status,
            ("POST", "/api/placement/retry"): retry,
            ("GET", "/api/placement/cache"): cache,
            ("POST", "/api/placement/pin"): pin,
            ("POST", "/api/placement/evict"): evict,
        }
    )


def _kind(body: Mapping[str, Any]) -> str | None:
    """The body's ``kind`` (None when absent), its ``name`` checked too: 400 for either that is invalid."""
    for key, check in (("kind", validate_kind), ("name", validate_name)):
        if body.get(key) is not None:
            try:
                check(body[key])
            except ArtifactError as exc:
                raise ApiError(400, exc.message, "invalid_value", key) from None
    return body.get("kind")
