"""Hot-swap routes (hydra_node/admin/runtime.py) over a fake runtime: every answer, no runner started."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from hydra_node.http.server import Request
from hydra_node.admin.runtime import MAX_BODY_BYTES, runtime_routes
from hydra_node.models import BUNDLED_MODEL_ID
from hydra_node.runtime.hosting.service import ModelConflict, ModelNotHosted
from hydra_node.runtime.runner.records import RunnerState


@dataclass(frozen=True)
class Status:
    model: str
    state: RunnerState


class FakeHosted:
    placement_error = "no usable workers"
    last_error = "boom"

    def __init__(self, model_id: str):
        self.model_id = model_id

    def status(self) -> Status:
        return Status(self.model_id, RunnerState.LOADING)


class FakeRuntime:
    def __init__(self, *, final: RunnerState = RunnerState.READY, load_error: Exception | None = None):
        self.final, self.load_error = final, load_error
        self.loaded: list[tuple[str, bool | None]] = []
        self.unloaded: list[str] = []

    def splits_status(self):
        return {m: Status(m, RunnerState.READY) for m, _ in self.loaded}

    async def load(self, model, *, force_split=None):
        if self.load_error is not None:
            raise self.load_error
        self.loaded.append((model.id, force_split))
        return FakeHosted(model.id)

    async def unload(self, model_id: str) -> None:
        if model_id not in [m for m, _ in self.loaded]:
            raise ModelNotHosted(f"model {model_id!r} is not hosted on this node")
        self.unloaded.append(model_id)

    async def wait_ready(self, model_id: str, timeout_s: float) -> RunnerState:
        return self.final


def _request(method: str, path: str, body: object = None) -> Request:
    raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    return Request(method=method, path=path, query={}, headers={}, body=raw)


async def _call(runtime, method: str, path: str, body: object = None):
    routes = runtime_routes(runtime)
    key = (method, path) if (method, path) in routes else (method, "/api/runtime/models/*")
    resp = await routes[key](_request(method, path, body))
    return resp.status, json.loads(resp.body)


async def test_load_returns_202_at_once_and_the_listing_shows_the_model():
    rt = FakeRuntime()
    status, body = await _call(rt, "POST", "/api/runtime/models", {"model": BUNDLED_MODEL_ID, "split": True})
    assert status == 202 and body == {"model": BUNDLED_MODEL_ID, "state": "loading"}
    assert rt.loaded == [(BUNDLED_MODEL_ID, True)]
    status, body = await _call(rt, "GET", "/api/runtime/models")
    assert status == 200 and body == {"models": {BUNDLED_MODEL_ID: {"model": BUNDLED_MODEL_ID, "state": "ready"}}}


@pytest.mark.parametrize(
    "final,expected,code",
    [
        (RunnerState.READY, 200, None),
        (RunnerState.FAILED, 502, "load_failed"),
        (RunnerState.PLACING, 504, "load_timeout"),
    ],
)
async def test_load_and_wait(final, expected, code):
    status, body = await _call(
        FakeRuntime(final=final),
        "POST",
        "/api/runtime/models",
        {"model": BUNDLED_MODEL_ID, "wait": True, "timeout_s": 5},
    )
    assert status == expected
    if code is not None:
        assert body["error"]["code"] == code and body["error"]["type"] == "server_error"
    if code == "load_timeout":
        assert "still placing after 5 s (no usable workers)" in body["error"]["message"]


@pytest.mark.parametrize(
    "body,code,param",
    [
        (b"[1]", "invalid_type", None),
        ({"model": ""}, "missing_required_parameter", "model"),
        ({}, "missing_required_parameter", "model"),
        ({"model": "m", "split": 1}, "invalid_type", "split"),
        ({"model": "m", "wait": "yes"}, "invalid_type", "wait"),
        ({"model": "m", "timeout_s": 0}, "invalid_value", "timeout_s"),
        ({"model": "m", "timeout_s": True}, "invalid_type", "timeout_s"),
        (b"not json", "invalid_json", None),
        ({"model": "m", "colour": 1}, "unknown_parameter", "colour"),
    ],
)
async def test_bad_load_requests_are_400(body, code, param):
    status, answer = await _call(FakeRuntime(), "POST", "/api/runtime/models", body)
    assert status == 400 and answer["error"]["code"] == code and answer["error"]["param"] == param
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["message"]


async def test_oversized_body_unknown_model_conflict_and_not_running():
    status, body = await _call(FakeRuntime(), "POST", "/api/runtime/models", b"x" * (MAX_BODY_BYTES + 1))
    assert status == 413 and body["error"]["code"] == "body_too_large"
    status, body = await _call(FakeRuntime(), "POST", "/api/runtime/models", {"model": "/no/such/model.gguf"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body = await _call(
        FakeRuntime(load_error=ModelConflict("already hosted")),
        "POST",
        "/api/runtime/models",
        {"model": BUNDLED_MODEL_ID},
    )
    assert status == 409 and body["error"] == {
        "message": "already hosted",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_exists",
    }
    status, body = await _call(
        FakeRuntime(load_error=RuntimeError("not running yet")),
        "POST",
        "/api/runtime/models",
        {"model": BUNDLED_MODEL_ID},
    )
    assert status == 503 and body["error"]["code"] == "not_ready"


async def test_unload():
    rt = FakeRuntime()
    await _call(rt, "POST", "/api/runtime/models", {"model": BUNDLED_MODEL_ID})
    status, body = await _call(rt, "DELETE", "/api/runtime/models/nope")
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body = await _call(rt, "DELETE", f"/api/runtime/models/{BUNDLED_MODEL_ID}")
    assert status == 200 and body == {"id": BUNDLED_MODEL_ID, "unloaded": True} and rt.unloaded == [BUNDLED_MODEL_ID]


@pytest.mark.parametrize(
    "ref,fragment",
    [
        ("bad\x00id=/x.gguf", "non-printable"),
        ("tab\tid=/x.gguf", "non-printable"),
        ("x" * 129 + "=/x.gguf", "the most is 128"),
        (" padded=/x.gguf", "blank at either end"),
        ("..=/x.gguf", "'..'"),
        ("\ud800=/x.gguf", "non-printable"),
    ],
)
async def test_bad_model_ids_are_400_and_nothing_is_loaded(ref, fragment):
    """An id the mesh announcement or a file name cannot hold is refused before anything is registered."""
    rt = FakeRuntime()
    status, body = await _call(rt, "POST", "/api/runtime/models", {"model": ref})
    assert status == 400 and body["error"]["code"] == "invalid_model_id" and fragment in body["error"]["message"]
    assert rt.loaded == []


@pytest.mark.parametrize("ref", ["/tmp/" + "a" * 300 + ".gguf", "id=/tmp/" + "a" * 300 + ".gguf"])
async def test_a_path_the_os_refuses_is_400_naming_the_field(ref):
    """A path component longer than the file system holds (ENAMETOOLONG) is the client's fault, not a 500."""
    rt = FakeRuntime()
    status, body = await _call(rt, "POST", "/api/runtime/models", {"model": ref})
    assert status == 400 and body["error"]["code"] == "invalid_value" and body["error"]["param"] == "model"
    assert "File name too long" in body["error"]["message"] and rt.loaded == []


async def test_a_65th_model_is_refused():
    from hydra_node.runtime.hosting.service import TooManyModels

    status, body = await _call(
        FakeRuntime(load_error=TooManyModels("hosts 64 models already")),
        "POST",
        "/api/runtime/models",
        {"model": BUNDLED_MODEL_ID},
    )
    assert status == 409 and body["error"]["code"] == "too_many_models"


async def test_the_runtime_refuses_more_models_than_an_announcement_holds(tmp_path):
    from hydra_node.models import MAX_HOSTED_MODELS, resolve_model
    from hydra_node.runtime.hosting.service import ModelRuntime, TooManyModels

    runtime = ModelRuntime.__new__(ModelRuntime)  # only the bookkeeping load() checks first
    runtime.runners, runtime.hosted = {}, {f"m{i}": object() for i in range(MAX_HOSTED_MODELS)}
    with pytest.raises(TooManyModels, match="the most is 64"):
        await runtime.load(resolve_model(None))
