"""KV state routes on the console port (docs/kv-reuse.md, docs/api.md).

* ``POST /api/kv/export`` ``{"model", "messages" | "prompt", "name"?, "publish"?}``: the runner of
  ``model`` writes the KV state of that prompt's exact tokens (the chat template applied as a chat
  completion would; a prompt no slot holds is prefilled first) to ``HOME/kv/exports/NAME/state.hykv``
  (``name`` defaults to ``p-`` and the prefix hash); with ``"publish": true`` that folder is then
  published as the ``kv_state`` artifact NAME through placement, its identity in the manifest.  200 with the name, path, token count,
  bytes, duration and the compatibility identity (and the publication when asked).
* ``POST /api/kv/import`` ``{"model", "name" | "path"}``: a local export of that name, else the
  ``kv_state`` artifact of that name materialised through placement, or an absolute file path, is
  loaded into a free slot of the runner, which then serves prompts starting with that prefix from
  the prompt cache.  Only when every identity field matches: otherwise 422 ``identity_mismatch``
  with ``error.fields`` naming the differing fields (the runner counts them; ``/api/status``
  ``kv_cache``).  422 for a corrupt or malformed file, 404 for an unknown model, name or path,
  409 when the runner keeps no prefixes, 503 when no slot can take the cells now.

The routes take the hosted runners (model id → an object with ``.kv``, a
:class:`~hydra_node.runtime.runner.kv_call.RunnerKv`) and :class:`KvPlacement`, the two calls of
placement they make (``publish(kind, name, source, identity=...)`` awaited until the operation
rests, ``materialise(kind, name) -> (manifest, folder)``); without placement ``publish`` is refused
(409), never ignored, and import by name looks only at local exports.  A publish that fails (the
store, or the VAST trigger after the commit) answers 502 ``publish_failed`` with the operation:
the exported file stays, and ``placement status`` says how to retry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from hydra_node.http.server import Request, Response
from hydra_node.admin.management import Handler
from hydra_node.api.errors import ApiError
from hydra_node.openai.parse import parse_body
from hydra_node.admin.status_json import to_json
from hydra_node.inference import GenerationError
from hydra_node.runtime.artifacts.errors import (
    ArtifactError,
    ArtifactNotFound,
    IdentityMismatch,
)
from hydra_node.runtime.artifacts.kv_state import KV_STATE_FILE
from hydra_node.runtime.runner.kv_call import RunnerKv

__all__ = ["MAX_KV_BODY_BYTES", "KvPlacement", "kv_routes", "kv_status"]

#: Longest accepted body: a long chat prompt (the OpenAI API's own bound is 8 MiB; a prefix worth
#: exporting fits in far less).
MAX_KV_BODY_BYTES = 4 * 1024 * 1024
KIND = "kv_state"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")



class KvPlacement(Protocol):
    """What the KV routes need of placement (``runtime/artifacts/service.py`` PlacementService)."""

    async def publish(self, kind: str, name: str, source: str, *, identity: Mapping[str, Any] | None = None) -> Any: ...

    async def materialise(self, kind: str, name: str) -> tuple[Any, Path]: ...


def _error(status: int, message: str, code: str, param: str | None = None, **extra) -> Response:
    body = ApiError(status, message, code, param).body()
    if status == 422:
        body["error"]["type"] = "invalid_request_error"
    body["error"].update(extra)
    return Response.json(status, body)


def _artifact_error(exc: ArtifactError) -> Response:
    """A runner's or placement's artifact error: what the caller gave cannot be used (422), is not
    there (404), or the store failed (its own status)."""
    if isinstance(exc, IdentityMismatch):
        return _error(422, str(exc), exc.code, fields=exc.fields)
    if isinstance(exc, ArtifactNotFound):
        return _error(404, str(exc), exc.code)
    return _error(422 if exc.code in ("checksum_mismatch", "kv_state_invalid") else exc.status, str(exc), exc.code)


def _body(request: Request, allowed: set[str]) -> dict:
    if len(request.body) > MAX_KV_BODY_BYTES:
        raise ApiError(413, f"body larger than {MAX_KV_BODY_BYTES} bytes", "body_too_large")
    try:
        body = request.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", "invalid_type")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r:.60}", "unknown_parameter", unknown[0][:60])
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ApiError(400, "'model' is required and must be a string", "missing_required_parameter", "model")
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
        raise ApiError(400, "'name' must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
                       "invalid_value", "name")
    return body


def kv_routes(runners: Mapping[str, Any], export_dir: Path,
              placement: KvPlacement | None = None) -> dict[tuple[str, str], Handler]:
    """The KV routes, keyed by (method, path); exports are written under ``export_dir``."""

    def runner(model: str) -> RunnerKv:
        kv = getattr(runners.get(model), "kv", None)
        if kv is None:
            raise ApiError(404, f"model {model!r:.200} is not hosted on this node", "model_not_found", "model")
        return kv

    async def export(request: Request) -> Response:
        try:
            body = _body(request, {"model", "messages", "prompt", "name", "publish"})
            if ("messages" in body) == ("prompt" in body):
                raise ApiError(400, "give exactly one of 'messages' or 'prompt'", "invalid_value", "messages")
            publishing = body.get("publish", False)
            if not isinstance(publishing, bool):
                raise ApiError(400, "'publish' must be true or false", "invalid_type", "publish")
            if publishing and placement is None:
                raise ApiError(409, "'publish' needs placement ([placement] posix_root or s3_bucket)",
                               "placement_not_configured", "publish")
            kind = "chat" if "messages" in body else "completion"
            sub = {k: body[k] for k in ("model", "messages", "prompt") if k in body}
            parsed = parse_body(json.dumps(sub).encode(), kind)
            if len(parsed.requests) != 1:
                raise ApiError(400, "'prompt' must be one prompt (a string or one array of token ids)",
                               "invalid_value", "prompt")
            req = parsed.request
            kv = runner(body["model"])
        except ApiError as exc:
            return exc.response()
        export_dir.mkdir(parents=True, exist_ok=True)
        tmp = export_dir / f".export-{id(request):x}.hykv"
        try:
            done = await kv.export(req, tmp)
            name = body.get("name") or "p-" + done.identity.prefix_sha256[:32]
            path = export_dir / name / KV_STATE_FILE
            path.parent.mkdir(exist_ok=True)
            tmp.replace(path)
        except ArtifactError as exc:
            return _artifact_error(exc)
        except GenerationError as exc:
            return ApiError.from_generation(exc).response()
        finally:
            tmp.unlink(missing_ok=True)  # left only when the exchange was abandoned after the child wrote it
        out = {"model": body["model"], "name": name, "path": str(path), "tokens": done.tokens, "bytes": done.bytes,
               "duration_ms": round(done.duration_ms, 1), "identity": done.identity.to_mapping(), "published": None}
        if publishing:
            try:
                op = await placement.publish(KIND, name, str(path.parent), identity=done.identity.to_mapping())
            except ArtifactError as exc:
                return _artifact_error(exc)
            out["published"] = pub = to_json(op)
            if isinstance(pub, dict) and pub.get("state") == "failed":
                why = (pub.get("error") or {}).get("message", "see the operation")
                return _error(502, f"exported to {path}, but publishing it failed: {why}", "publish_failed",
                              operation=pub)
        return Response.json(200, out)

    async def import_(request: Request) -> Response:
        try:
            body = _body(request, {"model", "name", "path"})
            if ("name" in body) == ("path" in body):
                raise ApiError(400, "give exactly one of 'name' or 'path'", "invalid_value", "name")
            if "path" in body and (not isinstance(body["path"], str) or not Path(body["path"]).is_absolute()):
                raise ApiError(400, "'path' must be an absolute file path", "invalid_value", "path")
            kv = runner(body["model"])
        except ApiError as exc:
            return exc.response()
        try:
            if "path" in body:
                path = Path(body["path"])
            elif (export_dir / body["name"] / KV_STATE_FILE).is_file():
                path = export_dir / body["name"] / KV_STATE_FILE
            elif placement is not None:
                path = (await placement.materialise(KIND, body["name"]))[1] / KV_STATE_FILE
            else:
                return _error(404, f"no local kv_state export named {body['name']!r} and no placement to "
                                   "fetch one from", "artifact_not_found", "name")
            done = await kv.import_state(path)
        except ArtifactError as exc:
            return _artifact_error(exc)
        except GenerationError as exc:
            return ApiError.from_generation(exc).response()
        return Response.json(200, {"model": body["model"], "path": str(path), "tokens": done.tokens,
                                   "bytes": done.bytes, "slot": done.slot, "duration_ms": round(done.duration_ms, 1)})

    return {("POST", "/api/kv/export"): export, ("POST", "/api/kv/import"): import_}


def kv_status(runners: Mapping[str, Any]) -> Callable[[], dict]:
    """The ``/api/status`` ``kv_cache`` section: each hosted model's KV transfer figures."""

    def status() -> dict:
        return {"models": {mid: to_json(r.kv.statistics()) for mid, r in list(runners.items())}}

    return status
