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
from hydra_node.admin.body import guarded, json_body
from hydra_node.admin.management import Handler
from hydra_node.api.errors import ApiError
from hydra_node.openai.parse import parse_body
from hydra_node.admin.status_json import to_json
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


def _body(request: Request, **optional: type | tuple[type, ...]) -> dict:
    """The body: ``model`` and the ``optional`` fields (name=type), a ``name`` of the export pattern."""
    body = json_body(request, required={"model": str}, optional=optional, max_bytes=MAX_KV_BODY_BYTES)
    if "name" in body and not _NAME.fullmatch(body["name"]):
        raise ApiError(
            400,
            "'name' must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
            "invalid_value",
            "name",
        )
    return body


def kv_routes(
    runners: Mapping[str, Any], export_dir: Path, placement: KvPlacement | None = None
) -> dict[tuple[str, str], Handler]:
    """The KV routes, keyed by (method, path); exports are written under ``export_dir``."""

    def runner(model: str) -> RunnerKv:
        kv = getattr(runners.get(model), "kv", None)
        if kv is None:
            raise ApiError(404, f"model {model!r:.200} is not hosted on this node", "model_not_found", "model")
        return kv

    async def export(request: Request) -> Response:
        body = _body(request, messages=list, prompt=(str, list), name=str, publish=bool)
        if ("messages" in body) == ("prompt" in body):
            raise ApiError(400, "give exactly one of 'messages' or 'prompt'", "invalid_value", "messages")
        publishing = body.get("publish", False)
        if publishing and placement is None:
            raise ApiError(
                409,
                "'publish' needs placement ([placement] posix_root or s3_bucket)",
                "placement_not_configured",
                "publish",
            )
        kind = "chat" if "messages" in body else "completion"
        sub = {k: body[k] for k in ("model", "messages", "prompt") if k in body}
        parsed = parse_body(json.dumps(sub).encode(), kind)
        if len(parsed.requests) != 1:
            raise ApiError(
                400, "'prompt' must be one prompt (a string or one array of token ids)", "invalid_value", "prompt"
            )
        req = parsed.request
        kv = runner(body["model"])
        export_dir.mkdir(parents=True, exist_ok=True)
        tmp = export_dir / f".export-{id(request):x}.hykv"
        try:
            done = await kv.export(req, tmp)
            name = body.get("name") or "p-" + done.identity.prefix_sha256[:32]
            path = export_dir / name / KV_STATE_FILE
            path.parent.mkdir(exist_ok=True)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)  # left only when the exchange was abandoned after the child wrote it
        out = {
            "model": body["model"],
            "name": name,
            "path": str(path),
            "tokens": done.tokens,
            "bytes": done.bytes,
            "duration_ms": round(done.duration_ms, 1),
            "identity": done.identity.to_mapping(),
            "published": None,
        }
        if publishing and placement is not None:  # None: refused above
            op = await placement.publish(KIND, name, str(path.parent), identity=done.identity.to_mapping())
            out["published"] = pub = to_json(op)
            if isinstance(pub, dict) and pub.get("state") == "failed":
                why = (pub.get("error") or {}).get("message", "see the operation")
                raise ApiError(
                    502,
                    f"exported to {path}, but publishing it failed: {why}",
                    "publish_failed",
                    extra={"operation": pub},
                )
        return Response.json(200, out)

    async def import_(request: Request) -> Response:
        body = _body(request, name=str, path=str)
        if ("name" in body) == ("path" in body):
            raise ApiError(400, "give exactly one of 'name' or 'path'", "invalid_value", "name")
        if "path" in body and not Path(body["path"]).is_absolute():
            raise ApiError(400, "'path' must be an absolute file path", "invalid_value", "path")
        kv = runner(body["model"])
        if "path" in body:
            path = Path(body["path"])
        elif (export_dir / body["name"] / KV_STATE_FILE).is_file():
            path = export_dir / body["name"] / KV_STATE_FILE
        elif placement is not None:
            path = (await placement.materialise(KIND, body["name"]))[1] / KV_STATE_FILE
        else:
            raise ApiError(
                404,
                f"no local kv_state export named {body['name']!r} and no placement to fetch one from",
                "artifact_not_found",
                "name",
            )
        done = await kv.import_state(path)
        return Response.json(
            200,
            {
                "model": body["model"],
                "path": str(path),
                "tokens": done.tokens,
                "bytes": done.bytes,
                "slot": done.slot,
                "duration_ms": round(done.duration_ms, 1),
            },
        )

    return guarded({("POST", "/api/kv/export"): export, ("POST", "/api/kv/import"): import_})


def kv_status(runners: Mapping[str, Any]) -> Callable[[], dict]:
    """The ``/api/status`` ``kv_cache`` section: each hosted model's KV transfer figures."""

    def status() -> dict:
        return {"models": {mid: to_json(r.kv.statistics()) for mid, r in list(runners.items())}}

    return status
