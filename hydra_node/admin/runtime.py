"""Management routes for hot swap (on the console port, next to ``/api/status``).

* ``GET /api/runtime/models`` – hosted models and their placement;
* ``POST /api/runtime/models`` ``{"model": PATH_OR_ID, "split": bool?, "wait": bool?, "timeout_s": S?,
  "mmproj": PATH?}`` – host a model on the running node (``mmproj``: with that projector GGUF beside it,
  docs/vision.md): 202 at once, or with ``wait`` 200 once ready
  (504 if not ready within ``timeout_s``, 502 if it failed); 409 if hosted already;
  404 for an unknown model; 400 for a bad body (``admin/body.py``) or a file that is no projector;
* ``DELETE /api/runtime/models/{id}`` – stop hosting it (200, or 404).

The routes take the model runtime through :class:`RuntimeAdmin`, the few calls they make;
the composition root (``hydra_node/node.py``) puts them in the management route table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol
from urllib.parse import unquote

from hydra_node.http.server import Request, Response
from hydra_node.admin.body import guarded, json_body
from hydra_node.admin.management import Handler
from hydra_node.api.errors import ApiError
from hydra_node.admin.status_json import to_json
from hydra_node.models import BadProjector, InvalidModelId, ModelNotFound, ModelRef, resolve_mmproj, resolve_model
from hydra_node.runtime.hosting.service import SWAP_WAIT_DEFAULT_S, ModelConflict, ModelNotHosted, TooManyModels
from hydra_node.runtime.runner.records import RunnerState

__all__ = ["MAX_BODY_BYTES", "MAX_WAIT_S", "HostedModelView", "RuntimeAdmin", "runtime_routes"]

#: Longest accepted body (a path and a few flags).
MAX_BODY_BYTES = 4096
#: Upper bound a caller may ask to wait for a load.
MAX_WAIT_S = 600.0


class HostedModelView(Protocol):
    """A hosted model as the routes look at it."""

    @property
    def placement_error(self) -> str | None: ...

    @property
    def last_error(self) -> str | None: ...

    def status(self) -> Any: ...


class RuntimeAdmin(Protocol):
    """What the hot-swap routes need of the model runtime."""

    def splits_status(self) -> Mapping[str, Any]: ...

    async def load(self, model: ModelRef, *, force_split: bool | None = None) -> HostedModelView: ...

    async def unload(self, model_id: str) -> None: ...

    async def wait_ready(self, model_id: str, timeout_s: float) -> RunnerState: ...


def _load_request(request: Request) -> tuple[str, bool | None, bool, float, str | None]:
    """(model reference, split, wait, timeout, projector path) of a load request; an :class:`ApiError` otherwise."""
    body = json_body(
        request,
        required={"model": str},
        optional={"split": bool, "wait": bool, "timeout_s": (int, float), "mmproj": str},
        max_bytes=MAX_BODY_BYTES,
    )
    timeout = body.get("timeout_s", SWAP_WAIT_DEFAULT_S)
    if not 0 < timeout <= MAX_WAIT_S:
        raise ApiError(400, f"'timeout_s' must be a number in (0, {MAX_WAIT_S:.0f}]", "invalid_value", "timeout_s")
    return body["model"], body.get("split"), body.get("wait", False), float(timeout), body.get("mmproj")


def runtime_routes(runtime: RuntimeAdmin) -> dict[tuple[str, str], Handler]:
    """The hot-swap routes over ``runtime``, keyed by (method, path; ``/*`` = any suffix)."""

    async def list_models(request: Request) -> Response:
        return Response.json(200, {"models": to_json(runtime.splits_status())})

    async def load_model(request: Request) -> Response:
        ref, split, wait, timeout, mmproj = _load_request(request)
        try:
            model = resolve_model(ref)
            if mmproj is not None:  # the projector served beside it (a local GGUF path; docs/vision.md)
                model = replace(model, mmproj=resolve_mmproj(mmproj, flag="'mmproj'"))
        except BadProjector as exc:
            return ApiError(400, str(exc), "invalid_value", "mmproj").response()
        except InvalidModelId as exc:
            return ApiError(400, f"bad model id: {exc}", "invalid_model_id", "model").response()
        except ModelNotFound as exc:
            return ApiError(404, str(exc), "model_not_found", "model").response()
        except (OSError, ValueError) as exc:  # a path the OS refuses to look at (name too long, a NUL)
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            return ApiError(
                400, f"'model' is not a usable path ({reason}): {ref[:80]!r}", "invalid_value", "model"
            ).response()
        try:
            hosted = await runtime.load(model, force_split=split)
        except ModelConflict as exc:
            return ApiError(409, str(exc), "model_exists", "model").response()
        except TooManyModels as exc:
            return ApiError(409, str(exc), "too_many_models", "model").response()
        except RuntimeError as exc:
            return ApiError(503, str(exc), "not_ready").response()
        if not wait:
            return Response.json(202, to_json(hosted.status()))
        state = await runtime.wait_ready(model.id, timeout)
        if state == RunnerState.READY:
            return Response.json(200, to_json(hosted.status()))
        if state == RunnerState.FAILED:
            return ApiError(502, f"model {model.id!r} failed to load: {hosted.last_error}", "load_failed").response()
        return ApiError(
            504,
            f"model {model.id!r} is still {state} after {timeout:g} s "
            f"({hosted.placement_error or hosted.last_error or 'loading'})",
            "load_timeout",
        ).response()

    async def unload_model(request: Request) -> Response:
        model_id = unquote(request.path.rstrip("/").rsplit("/", 1)[-1])
        try:
            await runtime.unload(model_id)
        except ModelNotHosted as exc:
            return ApiError(404, str(exc), "model_not_found").response()
        return Response.json(200, {"id": model_id, "unloaded": True})

    return guarded(
        {
            ("GET", "/api/runtime/models"): list_models,
            ("POST", "/api/runtime/models"): load_model,
            ("DELETE", "/api/runtime/models/*"): unload_model,
        }
    )
