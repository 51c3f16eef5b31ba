"""The stream routing table the root declares: by kind, tunnels by service; untrusted headers."""

from __future__ import annotations

import pytest

from hydra_node.mesh.stream_routes import StreamRoutes


async def generate(link, header, stream) -> None: ...
async def rpc(link, header, stream) -> None: ...


def test_headers_find_their_handler_and_nothing_else():
    routes = StreamRoutes()
    routes.add_kind("generate", generate)
    routes.add_tunnel("rpc", rpc)
    assert routes.handler_for({"kind": "generate", "req": {}}) is generate
    assert routes.handler_for({"kind": "tunnel", "service": "rpc"}) is rpc
    for header in (
        {},
        {"kind": "tunnel"},
        {"kind": "tunnel", "service": "draft"},
        {"kind": "tunnel", "service": ["rpc"]},
        {"kind": 7},
        {"kind": "rpc"},
        {"kind": ["generate"]},
        {"service": "rpc"},
    ):
        assert routes.handler_for(header) is None, header


def test_tunnels_are_declared_by_service_name_only():
    with pytest.raises(ValueError):
        StreamRoutes().add_kind("tunnel", rpc)
