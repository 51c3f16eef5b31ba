"""The management routes' one body parser and one error mapping (hydra_node/admin/body.py): the same
fault gets the same status and code on every POST route, and each typed error its one answer."""

from __future__ import annotations

import json
import types

import pytest

from hydra_node.admin import invites, kv, models, placement, runtime
from hydra_node.admin.body import error_response, json_body
from hydra_node.api.errors import ApiError
from hydra_node.http.server import Request
from hydra_node.inference import GenerationError
from hydra_node.runtime.artifacts.errors import ArtifactNotFound, IdentityMismatch
from hydra_node.runtime.artifacts.kv_state import KvStateCorrupt
from hydra_node.runtime.fetch.errors import DiskError, NotInMesh, PeerFetchError


def _request(body: bytes, path: str = "/x") -> Request:
    return Request("POST", path, {}, {"content-type": "application/json"}, body)


def _answer(resp) -> tuple[int, dict]:
    return resp.status, json.loads(resp.body)


def _tables(tmp_path) -> dict[tuple[str, str], object]:
    """Every POST route, over stand-ins never reached: each body below is refused first."""
    mesh = types.SimpleNamespace(joined=True, invite_ttl_s=600.0, invites=None)
    return {
        **invites.invite_routes(mesh),
        **kv.kv_routes({}, tmp_path),
        **models.models_routes(object()),
        **placement.placement_routes(object()),
        **runtime.runtime_routes(object()),
    }


#: (path, its body bound, whether it has a required field)
POST_ROUTES = [
    ("/api/invite", invites.MAX_BODY_BYTES, False),
    ("/api/invite/revoke", invites.MAX_BODY_BYTES, True),
    ("/api/kv/export", kv.MAX_KV_BODY_BYTES, True),
    ("/api/kv/import", kv.MAX_KV_BODY_BYTES, True),
    ("/api/models/fetch", models.MAX_BODY_BYTES, True),
    ("/api/runtime/models", runtime.MAX_BODY_BYTES, True),
    *((f"/api/placement/{p}", placement.MAX_BODY_BYTES, True) for p in ("prefetch", "fetch", "retry", "pin", "evict")),
]


@pytest.mark.parametrize("path,limit,requires", POST_ROUTES)
async def test_every_post_route_answers_a_fault_alike(tmp_path, path, limit, requires):
    handler = _tables(tmp_path)[("POST", path)]
    faults = [
        (b"x" * (limit + 1), 413, "body_too_large", None),
        (b"{", 400, "invalid_json", None),
        (b"\xff\xfe{", 400, "invalid_json", None),
        (b"[" * 100 + b"]" * 100, 400, "invalid_json", None),
        (b"[1]", 400, "invalid_type", None),
        (b'"x"', 400, "invalid_type", None),
        (b'{"colour": 1}', 400, "unknown_parameter", "colour"),
    ]
    if requires:
        faults.append((b"{}", 400, "missing_required_parameter", None))
    for raw, status, code, param in faults:
        got_status, got = _answer(await handler(_request(raw, path)))
        assert (got_status, got["error"]["code"]) == (status, code), (path, raw[:20], got)
        assert got["error"]["type"] == "invalid_request_error" and got["error"]["message"]
        if param is not None:
            assert got["error"]["param"] == param


def test_json_body_checks_types_drops_optional_nulls_and_takes_an_empty_body_as_empty():
    fields = {
        "required": {"model": str},
        "optional": {"n": int, "x": (int, float), "on": bool, "ids": list},
        "max_bytes": 1024,
    }
    assert json_body(_request(b'{"model": "m", "n": null, "x": 1, "on": false}'), **fields) == {
        "model": "m",
        "x": 1,
        "on": False,
    }
    assert json_body(_request(b""), max_bytes=10) == {} and json_body(_request(b" \n"), max_bytes=10) == {}
    for raw, code, param in (
        (b'{"model": "m", "n": true}', "invalid_type", "n"),  # true is no number
        (b'{"model": "m", "on": 1}', "invalid_type", "on"),
        (b'{"model": "m", "ids": {}}', "invalid_type", "ids"),
        (b'{"model": 5}', "invalid_type", "model"),
        (b'{"model": ""}', "missing_required_parameter", "model"),
        (b'{"model": null}', "missing_required_parameter", "model"),
    ):
        with pytest.raises(ApiError) as err:
            json_body(_request(raw), **fields)
        assert (err.value.status, err.value.code, err.value.param) == (400, code, param), raw
    with pytest.raises(ApiError, match="'x' must be an integer or a number"):
        json_body(_request(b'{"model": "m", "x": "1"}'), **fields)


@pytest.mark.parametrize(
    "exc,status,code",
    [
        (ApiError(409, "held", "artifact_held"), 409, "artifact_held"),
        (ArtifactNotFound("none"), 404, "artifact_not_found"),
        (KvStateCorrupt("bad bytes"), 422, "checksum_mismatch"),
        (NotInMesh("no peer"), 404, "not_in_mesh"),
        (PeerFetchError("broke"), 502, "peer_fetch_failed"),
        (DiskError("full"), 502, "disk"),
        (GenerationError("no slot", code="no_free_slot", status=503, retry_after=2), 503, "no_free_slot"),
    ],
)
def test_error_response_answers_each_typed_error_once(exc, status, code):
    got_status, got = _answer(error_response(exc))
    assert (got_status, got["error"]["code"]) == (status, code) and got["error"]["message"]


def test_an_identity_mismatch_is_422_with_its_fields():
    status, got = _answer(error_response(IdentityMismatch(["type_k", "n_ctx"])))
    assert status == 422 and got["error"]["fields"] == ["type_k", "n_ctx"]
    assert got["error"]["type"] == "invalid_request_error" and got["error"]["code"] == "identity_mismatch"
