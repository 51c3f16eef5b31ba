"""The composition root (hydra_node/node.py): what it declares, and the JSON it renders from typed statistics."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import trio

from hydra_node.http.server import Request
from hydra_node.admin.status_json import to_json
from hydra_node.config import NodeConfig
from hydra_node.mesh.settings import MeshSettings
from hydra_node.node import Node
from hydra_node.runtime.hosting.service import RpcWorkerOff

SECTIONS = {
    "speculation",
    "network_costs",
    "scheduler",
    "splits",
    "rpc_worker",
    "config",
    "invites",
    "events",
    "model_share",
    "placement",
    "kv_cache",
    "rehost",
}
ROUTES = {
    ("POST", "/api/invite"),
    ("GET", "/api/invites"),
    ("POST", "/api/invite/revoke"),
    ("GET", "/metrics"),
    ("GET", "/api/runtime/models"),
    ("POST", "/api/runtime/models"),
    ("DELETE", "/api/runtime/models/*"),
    ("GET", "/api/events"),
    ("GET", "/api/history"),
    ("POST", "/api/models/fetch"),
    ("POST", "/api/placement/prefetch"),
    ("POST", "/api/placement/fetch"),
    ("GET", "/api/placement/status"),
    ("GET", "/api/placement/status/*"),
    ("POST", "/api/placement/retry"),
    ("GET", "/api/placement/cache"),
    ("POST", "/api/placement/pin"),
    ("POST", "/api/placement/evict"),
    ("POST", "/api/kv/export"),
    ("POST", "/api/kv/import"),
    ("GET", "/api/rehost"),
    ("POST", "/api/rehost/min-hosts"),
}


def _config(tmp_path, **kw) -> NodeConfig:
    return NodeConfig(home=tmp_path, no_model=True, api_port=0, console_port=0, rpc_worker=False, **kw)


def _get(path: str, body: bytes = b"", method: str = "GET") -> Request:
    return Request(method=method, path=path, query={}, headers={}, body=body)


async def test_the_root_declares_every_route_and_status_section(tmp_path):
    node = Node(_config(tmp_path, mesh=MeshSettings(listen_host="127.0.0.1", listen_port=0)))
    assert set(node.status_sections) == SECTIONS
    assert set(node.management_routes) == ROUTES
    assert node.remote is not None  # remote generation: a router source and the generate stream handler
    st = node.status()
    assert SECTIONS <= set(st) and st["rpc_worker"] == {"enabled": False}
    assert st["speculation"]["mode"] == "off" and st["splits"] == {}
    assert st["routing"] == {
        "retries": 0,
        "no_target": 0,
        "continuations": 0,
        "continuation_failures": 0,
        "target_waits": {"routed": 0, "timed_out": 0, "gave_up": 0, "client_gone": 0},
    }
    json.dumps(st)  # plain JSON, nothing left typed


async def test_status_without_a_mesh_and_its_management_routes(tmp_path):
    node = Node(_config(tmp_path))
    assert node.mesh is None and node.remote is None
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(node.run)
        st = node.status()
        assert st["node_state"] == "serving" and st["mesh"] is None and "token" not in st
        assert st["models"] == [] and SECTIONS <= set(st)
        invite = await node.management_routes[("POST", "/api/invite")](_get("/api/invite", b"{}", "POST"))
        assert invite.status == 503 and json.loads(invite.body)["error"]["code"] == "no_mesh"
        metrics = await node.management_routes[("GET", "/metrics")](_get("/metrics"))
        assert metrics.status == 200 and b"hydra_route_retries" in metrics.body
        assert b"hydra_scheduler_mode" in metrics.body and b"hydra_gossip_messages" not in metrics.body
        listing = await node.management_routes[("GET", "/api/runtime/models")](_get("/api/runtime/models"))
        assert listing.status == 200 and json.loads(listing.body) == {"models": {}}
        gone = await node.management_routes[("DELETE", "/api/runtime/models/*")](
            _get("/api/runtime/models/nope", method="DELETE")
        )
        assert gone.status == 404 and json.loads(gone.body)["error"]["code"] == "model_not_found"
        node.request_stop()


@dataclass(frozen=True)
class _Inner:
    peer: str
    maybe: str | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class _Outer:
    name: str
    inner: tuple[_Inner, ...]
    plan: dict | None = field(default=None, metadata={"omit_none": True})
    kept_none: str | None = None


def test_to_json_walks_dataclasses_keeps_field_order_and_omits_only_marked_nones():
    value = _Outer("x", (_Inner("p"), _Inner("q", "m")), plan={"devices": [_Inner("d")]})
    assert to_json(value) == {
        "name": "x",
        "inner": [{"peer": "p"}, {"peer": "q", "maybe": "m"}],
        "plan": {"devices": [{"peer": "d"}]},
        "kept_none": None,
    }
    assert list(to_json(value)) == [f.name for f in dataclasses.fields(_Outer)]
    assert "plan" not in to_json(_Outer("x", ()))
    assert to_json(RpcWorkerOff()) == {"enabled": False}


async def test_a_meshed_node_issues_invites_and_exports_mesh_statistics(tmp_path):
    node = Node(_config(tmp_path, mesh=MeshSettings(listen_host="127.0.0.1", listen_port=0)))
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(node.run)
        st = node.status()
        assert st["mesh"]["mesh_id"] and "token" not in st  # invites only through POST /api/invite
        assert "remote_generations_opened" in st["mesh"]["counters"]  # remote generation's, merged by the root
        invite = await node.management_routes[("POST", "/api/invite")](
            _get("/api/invite", json.dumps({"ttl_s": 120}).encode(), "POST")
        )
        body = json.loads(invite.body)
        assert invite.status == 200 and body["mesh_id"] == st["mesh"]["mesh_id"] and body["token"]
        bad = await node.management_routes[("POST", "/api/invite")](
            _get("/api/invite", json.dumps({"ttl_s": 1}).encode(), "POST")
        )
        assert bad.status == 400 and json.loads(bad.body)["error"]["param"] == "ttl_s"
        metrics = await node.management_routes[("GET", "/metrics")](_get("/metrics"))
        assert b"hydra_gossip_messages" in metrics.body and b"hydra_links 0.0" in metrics.body
        node.request_stop()
