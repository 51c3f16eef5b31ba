"""Management routes for hot swap (on the console port, next to ``/api/status``).

* ``GET /api/runtime/models`` – hosted models and their placement;
* ``POST /api/runtime/models`` ``{"model": PATH_OR_ID, "split": bool?, "wait": bool?, "timeout_s": S?}``
  – host a model on the running node: 202 at once, or with ``wait`` 200 once ready
  (504 if not ready within ``timeout_s``, 502 if it failed); 409 if hosted already;
  404 for an unknown model; 400 for a bad body;
* ``DELETE /api/runtime/models/{id}`` – stop hosting it (200, or 404).
"""

from __future__ import annotations

from urllib.parse import unquote

from hydra_node.api.http import Response
from hydra_node.models import ModelNotFound, resolve_model

from .hosting import SWAP_WAIT_DEFAULT_S, ModelConflict, UnknownModel

#: Longest accepted body (a path and a few flags).
MAX_BODY_BYTES = 4096
#: Upper bound a caller may ask to wait for a load.
MAX_WAIT_S = 600.0


def _error(status: int, message: str, code: str, param: str | None = None) -> Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return Response.json(status, {"error": {"message": message, "type": kind, "param": param, "code": code}})


def install_routes(node, runtime) -> None:
    routes = node.management_routes()

    async def list_models(request) -> Response:
        return Response.json(200, {"models": runtime.splits_status()})

    async def load_model(request) -> Response:
        if len(request.body) > MAX_BODY_BYTES:
            return _error(400, f"body larger than {MAX_BODY_BYTES} bytes", "body_too_large")
        try:
            body = request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            ref = body.get("model")
            if not isinstance(ref, str) or not ref:
                raise ValueError("'model' must be a GGUF path, ID=PATH or the bundled id")
            split = body.get("split")
            if split is not None and not isinstance(split, bool):
                raise ValueError("'split' must be true or false")
            wait = body.get("wait", False)
            if not isinstance(wait, bool):
                raise ValueError("'wait' must be true or false")
            timeout = body.get("timeout_s", SWAP_WAIT_DEFAULT_S)
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_WAIT_S:
                raise ValueError(f"'timeout_s' must be a number in (0, {MAX_WAIT_S:.0f}]")
        except ValueError as exc:
            return _error(400, f"bad load request: {exc}", "invalid_value", "model")
        try:
            model = resolve_model(ref)
        except ModelNotFound as exc:
            return _error(404, str(exc), "model_not_found", "model")
        try:
            hosted = await runtime.load(model, force_split=split)
        except ModelConflict as exc:
            return _error(409, str(exc), "model_exists", "model")
        except RuntimeError as exc:
            return _error(503, str(exc), "not_ready")
        if not wait:
            return Response.json(202, hosted.status())
        state = await runtime.wait_ready(model.id, float(timeout))
        st = hosted.status()
        if state == "ready":
            return Response.json(200, st)
        if state == "failed":
            return _error(502, f"model {model.id!r} failed to load: {hosted.sup.last_error}", "load_failed")
        return _error(504, f"model {model.id!r} is still {state} after {timeout} s "
                           f"({hosted.placement_error or hosted.sup.last_error or 'loading'})", "load_timeout")

    async def unload_model(request) -> Response:
        model_id = unquote(request.path.rstrip("/").rsplit("/", 1)[-1])
        try:
            await runtime.unload(model_id)
        except UnknownModel as exc:
            return _error(404, str(exc), "model_not_found")
        return Response.json(200, {"id": model_id, "unloaded": True})

    routes[("GET", "/api/runtime/models")] = list_models
    routes[("POST", "/api/runtime/models")] = load_model
    routes[("DELETE", "/api/runtime/models/*")] = unload_model
