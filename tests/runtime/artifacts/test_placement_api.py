"""The /api/placement routes (admin/placement.py) over a real service and POSIX root; the
[placement] checks and the serve flags that override them."""

from __future__ import annotations

import json
import types

import nacl.signing
import pytest
import trio

from hydra_node.http.server import Request
from hydra_node.admin.placement import placement_routes
from hydra_node.cli.placement import apply_placement_args
from hydra_node.config import (
    ConfigError,
    FileConfig,
    PlacementSection,
    parse_config_text,
)
from hydra_node.runtime.artifacts.manifest import signer
from hydra_node.runtime.artifacts.service import PlacementService


async def call(routes, method: str, path: str, body=None, query=None) -> tuple[int, dict]:
    handler = routes.get((method, path)) or routes[(method, path.rsplit("/", 1)[0] + "/*")]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else b""
    resp = await handler(Request(method, path, query or {}, {"content-type": "application/json"}, raw))
    return resp.status, json.loads(resp.body)


@pytest.fixture
async def routes(tmp_path, nursery):
    (tmp_path / "ns").mkdir()
    svc = PlacementService(
        PlacementSection(posix_root=str(tmp_path / "ns")),
        home=tmp_path / "home",
        node_id="00" * 32,
        sign=signer(nacl.signing.SigningKey(bytes(32))),
    )
    await nursery.start(svc.run)
    return placement_routes(svc)


async def test_prefetch_status_fetch_cache_pin(routes, tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF" + bytes(60))
    code, op = await call(
        routes, "POST", "/api/placement/prefetch", {"kind": "model_weights", "name": "m", "source": str(src)}
    )
    assert code == 202 and op["state"] == "queued" and op["done"] is False
    for _ in range(200):
        code, got = await call(routes, "GET", f"/api/placement/status/{op['id']}")
        if got["done"]:
            break
        await trio.sleep(0.02)
    assert code == 200 and got["state"] == "committed" and got["manifest"]["files"][0]["path"] == "model.gguf"
    code, same = await call(routes, "GET", "/api/placement/status", query={"id": op["id"]})
    assert code == 200 and same["id"] == op["id"]
    code, fetch = await call(routes, "POST", "/api/placement/fetch", {"kind": "model_weights", "name": "m"})
    assert code == 202 and fetch["action"] == "fetch"
    code, pin = await call(routes, "POST", "/api/placement/pin", {"name": "m", "kind": "model_weights"})
    assert code == 200 and pin["pinned"] is True
    code, listing = await call(routes, "GET", "/api/placement/cache")
    assert code == 200 and listing["pins"] == [{"kind": "model_weights", "name": "m"}]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/api/placement/prefetch", b"[1]", 400, "invalid_type"),
        ("POST", "/api/placement/prefetch", b"{", 400, "invalid_json"),
        ("POST", "/api/placement/prefetch", b"x" * (256 * 1024 + 1), 413, "body_too_large"),
        ("POST", "/api/placement/prefetch", {"kind": "model_weights", "name": "m"}, 400, "missing_required_parameter"),
        ("POST", "/api/placement/prefetch", {"kind": "model_weights", "name": 5, "source": "/x"}, 400, "invalid_type"),
        (
            "POST",
            "/api/placement/prefetch",
            {"kind": "model_weights", "name": "m", "source": "/x", "identity": [1]},
            400,
            "invalid_type",
        ),
        ("POST", "/api/placement/prefetch", {"kind": "weights", "name": "m", "source": "/x"}, 400, "invalid_value"),
        (
            "POST",
            "/api/placement/prefetch",
            {"kind": "model_weights", "name": "../m", "source": "/x"},
            400,
            "invalid_value",
        ),
        (
            "POST",
            "/api/placement/prefetch",
            {"kind": "model_weights", "name": "m", "source": "/x", "ttl": 5},
            400,
            "unknown_parameter",
        ),
        (
            "POST",
            "/api/placement/prefetch",
            {"kind": "model_weights", "name": "m", "source": "/x", "posix_root": "/a", "s3_bucket": "b"},
            400,
            "invalid_value",
        ),
        (
            "POST",
            "/api/placement/prefetch",
            {"kind": "model_weights", "name": "m", "source": "/x", "vast": {"endpoint": "http://v", "colour": "red"}},
            400,
            "invalid_value",
        ),
        (
            "POST",
            "/api/placement/prefetch",
            {"kind": "model_weights", "name": "m", "source": "rel"},
            400,
            "source_invalid",
        ),
        ("GET", "/api/placement/status/op-00000000-00000000", None, 404, "operation_not_found"),
        ("GET", "/api/placement/status", None, 400, "invalid_value"),
        ("POST", "/api/placement/retry", {"id": "op-00000000-00000000"}, 404, "operation_not_found"),
        ("POST", "/api/placement/pin", {"name": "m", "pinned": "yes"}, 400, "invalid_type"),
        ("POST", "/api/placement/evict", {"name": "m", "posix_root": "/ns"}, 400, "invalid_value"),
        ("POST", "/api/placement/fetch", {"kind": "kv_state", "name": "nowhere"}, 202, None),
    ],
)
async def test_bad_requests_get_typed_json_errors(routes, method, path, body, status, code):
    got_status, got = await call(routes, method, path, body)
    assert got_status == status
    if code is not None:
        assert got["error"]["code"] == code and got["error"]["message"]


def test_placement_keys_are_checked_and_act():
    assert (
        parse_config_text(
            "[placement]\nposix_root = '/vast/hydra'\ns3_bucket = 'b'\ns3_region = 'eu'\ncache_ttl_secs = 0\n"
        ).reserved_keys
        == ()
    )
    for text, key in [
        ("posix_root = 'rel'", "posix_root"),
        ("prefetch_threshold = 0.5", "prefetch_threshold"),
        ("s3_prefix = 'p'", "s3_prefix"),
        ("vast_tenant = 'acme'", "vast_tenant"),
        ("vast_trigger_endpoint = 'ftp://x'", "vast_trigger_endpoint"),
        ("cache_capacity_gb = -1", "cache_capacity_gb"),
        ("cache_ttl_secs = -5", "cache_ttl_secs"),
        ("s3_endpoint = 'not a url'\ns3_bucket = 'b'", "s3_endpoint"),
        ("cache_ttl = 5", "cache_ttl"),
        ("s3_part_size_mb = 4", "s3_part_size_mb"),
        ("s3_multipart_threshold_mb = 6000", "s3_multipart_threshold_mb"),
    ]:
        with pytest.raises(ConfigError, match=rf"\[placement\]\.{key}"):
            parse_config_text(f"[placement]\n{text}\n")


def test_the_s3_multipart_sizes_reach_the_store(tmp_path):
    placement = parse_config_text(
        "[placement]\ns3_bucket = 'b'\ns3_endpoint = 'http://127.0.0.1:9'\n"
        "s3_multipart_threshold_mb = 64\ns3_part_size_mb = 16\n"
    ).placement
    service = PlacementService(placement, home=tmp_path, node_id="0" * 64, sign=lambda m: m)
    store = service._store(service.namespaces[0])  # opening a client sends nothing
    assert (store._transfer.multipart_threshold, store._transfer.multipart_chunksize) == (64 << 20, 16 << 20)


def test_serve_flags_override_the_file_and_are_checked():
    file_cfg = FileConfig(placement=PlacementSection(posix_root="/from/file", vast_tenant="", cache_ttl_secs=7))
    args = types.SimpleNamespace(
        posix_root="/from/flag",
        s3_bucket=None,
        vast_trigger_endpoint="https://v/x",
        vast_tenant="acme",
        vast_dataspace=None,
        vast_source_namespace=None,
        vast_destination_namespace=None,
        vast_target_site="site-b",
    )
    got = apply_placement_args(args, file_cfg).placement
    assert (got.posix_root, got.vast_tenant, got.vast_target_site, got.cache_ttl_secs) == (
        "/from/flag",
        "acme",
        "site-b",
        7,
    )
    args.vast_trigger_endpoint = None
    with pytest.raises(ConfigError, match="--vast-tenant"):
        apply_placement_args(args, file_cfg)
