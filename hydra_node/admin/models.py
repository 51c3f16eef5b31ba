"""Management route for models from mesh peers (on the console port, next to ``/api/status``):

* ``POST /api/models/fetch`` ``{"model": NAME_OR_REF, "sha256"?: HEX}`` – fetch the model from a
  peer that shares it into the node's one cache, ``<home>/placement/cache`` (sha256-verified, against ``sha256`` when given, else the
  catalogue's or the pinned digest, else the one the holder announces: recorded as vouched for by
  that peer; ``hydra models pull [--sha256 HEX]`` calls it before the internet):
  200 ``{"model", "path", "size_bytes", "sha256", "sha256_origin", "source"}`` (``source`` ``"cache"`` when it was
  there already), 404 ``not_in_mesh`` when no alive peer announces it, 502 ``peer_fetch_failed``
  when every holder failed, 400 for a bad body (``admin/body.py``), reference or ``sha256``, 409
  ``checksum_mismatch`` when the cached copy has another digest than ``sha256``.

The composition root (``hydra_node/node.py``) puts it in the management route table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydra_node.http.server import Request, Response
from hydra_node.admin.body import guarded, json_body
from hydra_node.admin.management import Handler
from hydra_node.api.errors import ApiError
from hydra_node.runtime.fetch import (
    BadModelSource,
    CachedModel,
    ModelShare,
    RemoteModel,
    load_catalogue,
    resolve_remote,
)
from hydra_node.runtime.fetch.catalogue import with_sha256

__all__ = ["MAX_BODY_BYTES", "models_routes"]

#: Longest accepted body (a model reference).
MAX_BODY_BYTES = 4096


def _answer(rec: CachedModel, root: Any, source: str) -> Response:
    return Response.json(
        200,
        {
            "model": rec.model_id,
            "path": str(rec.path(root)),
            "size_bytes": rec.size_bytes,
            "sha256": rec.sha256,
            "sha256_origin": rec.sha256_origin,
            "source": source,
        },
    )


def models_routes(
    share: ModelShare, resolve: Callable[[str], RemoteModel] | None = None
) -> dict[tuple[str, str], Handler]:
    """``resolve(ref)``: a catalogue name or URL → the model to fetch (``BadModelSource`` otherwise);
    by default the built-in catalogue (a peer is asked by model id and sha256, so the Hub URL is moot)."""
    resolve = resolve or (lambda ref: resolve_remote(ref, load_catalogue()))

    async def fetch_model(request: Request) -> Response:
        body = json_body(request, required={"model": str}, optional={"sha256": str}, max_bytes=MAX_BODY_BYTES)
        try:
            remote = resolve(body["model"])
        except BadModelSource as exc:
            return ApiError(400, str(exc), "invalid_model", "model").response()
        if "sha256" in body:
            try:
                remote = with_sha256(remote, body["sha256"])
            except BadModelSource as exc:
                return ApiError(400, str(exc), "invalid_sha256", "sha256").response()
        rec = share.cache.lookup(remote.model_id)
        if rec is not None and remote.sha256 is not None and rec.sha256 != remote.sha256:
            return ApiError(
                409,
                f"{remote.model_id}: the cached copy has sha256 {rec.sha256}, not {remote.sha256}",
                "checksum_mismatch",
                "sha256",
            ).response()
        if rec is not None:
            return _answer(rec, share.cache.root, "cache")
        rec = await share.fetch(remote)  # NotInMesh: 404, another PeerFetchError: 502 (admin/body.py)
        return _answer(rec, share.cache.root, rec.source)

    return guarded({("POST", "/api/models/fetch"): fetch_model})
