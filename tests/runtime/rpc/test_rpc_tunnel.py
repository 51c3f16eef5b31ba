"""RPC tunnels and leases over real encrypted peer links on loopback.

The "worker" is a plain TCP echo server: the tunnel carries any bytes, even ones that are
not ggml RPC (its framer then only slows down), and tests/runtime/rpc/test_mesh_split.py runs
real llama.cpp through it.
Two coordinator links to one worker node show the lease rule.

Time is virtual (trio's autojump clock) wherever every byte moves inside this trio run: the
link and the Python pump. The native pump copies bytes on a thread of its own, which trio
cannot see, so that variant keeps the real clock; every wait is for a condition, bounded.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio
from nacl.signing import SigningKey
from trio.testing import MockClock

from hydra_node.mesh.link.endpoints import LinkListener, open_link
from hydra_node.mesh.wire.errors import StreamReset
from hydra_node.mesh.wire.ids import MeshSecret
from hydra_node.mesh.link.peer_link import LinkSettings
from hydra_node.runtime.rpc import native_pump
from hydra_node.runtime.rpc.tunnel import TUNNEL_SERVICE, RemoteWorkerTunnel, RpcTunnelServer, TunnelError
from waiting import AUTOJUMP_IDLE_S, wait_until

TIMEOUT_S = 20
PAYLOAD = bytes(range(256)) * 4096  # 1 MiB: several stream windows, so backpressure is exercised


class LinkDirectory:
    """What RemoteWorkerTunnel needs from MeshService: ``link_to(peer_id)`` (here one open link)."""

    def __init__(self, link):
        self.link = link

    async def link_to(self, peer_id: str):
        assert peer_id == self.link.peer_id
        return self.link


async def echo_server(nursery: trio.Nursery) -> str:
    async def echo(tcp: trio.SocketStream) -> None:
        try:
            while data := await tcp.receive_some(65536):
                await tcp.send_all(data)
        except trio.BrokenResourceError:
            pass

    listeners = await nursery.start(partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
    return f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def roundtrip(endpoint: str, payload: bytes) -> bytes:
    host, _, port = endpoint.rpartition(":")
    tcp = await trio.open_tcp_stream(host, int(port))
    got = bytearray()
    async with tcp, trio.open_nursery() as n:
        n.start_soon(tcp.send_all, payload)
        while len(got) < len(payload):
            got += await tcp.receive_some(65536)
    return bytes(got)


@pytest.fixture
def clock(request) -> MockClock | None:
    """The autojump clock, except for the native pump, whose thread trio cannot see (None: the real clock)."""
    params = getattr(request.node, "callspec", None)
    if params is not None and params.params.get("worker_node") == "data-native":
        return None
    return MockClock(autojump_threshold=AUTOJUMP_IDLE_S)


@pytest.fixture(params=["link", "data-native", "data-python"])
async def worker_node(request, nursery, monkeypatch):
    """A listener that serves ``tunnel``/``rpc`` streams to an echo "worker", with each of
    the three paths a connection can take: the link stream (no data port), a data
    connection pumped natively, and one pumped in Python."""
    mesh = MeshSecret(bytes([0x42]) * 32)
    endpoint = await echo_server(nursery)
    server = RpcTunnelServer("w", lambda: (endpoint, "7.0.0", 1 << 30, "CPU"))
    if request.param.startswith("data"):
        await nursery.start(server.serve_data, "127.0.0.1")
    if request.param == "data-native":
        assert native_pump.native() is not None, native_pump.load_error()
    elif request.param == "data-python":
        monkeypatch.setattr(native_pump, "native", lambda: None)

    async def on_stream(link, header: dict[str, Any], stream) -> None:
        assert header["kind"] == "tunnel" and header["service"] == TUNNEL_SERVICE
        await server.handle(link, header, stream)

    listener = LinkListener(LinkSettings(identity=SigningKey.generate(), mesh=mesh, on_stream=on_stream))
    port = await nursery.start(listener.serve, "127.0.0.1", 0)
    return server, f"ws://127.0.0.1:{port}", mesh


async def test_tunnel_carries_bytes_and_leases_are_exclusive(worker_node, clock) -> None:
    server, url, mesh = worker_node
    with trio.fail_after(TIMEOUT_S):
        async with (
            open_link(url, LinkSettings(identity=SigningKey.generate(), mesh=mesh)) as a,
            open_link(url, LinkSettings(identity=SigningKey.generate(), mesh=mesh)) as b,
        ):
            async with trio.open_nursery() as nursery:
                tunnel = RemoteWorkerTunnel(LinkDirectory(a), a.peer_id, tag="model-a")
                async with trio.open_nursery() as held:
                    info = await held.start(tunnel.run)
                    assert str(info.proto) == "7.0.0" and info.free_bytes == 1 << 30
                    assert await roundtrip(info.endpoint, PAYLOAD) == PAYLOAD
                    assert await roundtrip(info.endpoint, b"again") == b"again"
                    assert server.holder().endswith("/model-a")
                    # The path taken: a data connection when the worker node has a data port.
                    with_data = server.data.port is not None
                    assert tunnel.data_connections == (2 if with_data else 0) == server.counters["data_connections"]
                    await wait_until(lambda: tunnel.bytes_down >= len(PAYLOAD) + 5)  # counted as each connection closes
                    assert tunnel.bytes_up == tunnel.bytes_down == len(PAYLOAD) + 5
                    [row] = server.leases()  # /api/status rpc_worker.leases: who, for which model, since, bytes
                    assert (row.coordinator, row.model, row.bytes_in, row.bytes_out) == (
                        server.holder()[:64],
                        "model-a",
                        len(PAYLOAD) + 5,
                        len(PAYLOAD) + 5,
                    ) and row.since > 1e9

                    # Another coordinator (and the same node for another model) is refused, clearly.
                    for link, tag in ((b, "model-a"), (a, "model-b")):
                        with pytest.raises(TunnelError) as err:
                            await nursery.start(RemoteWorkerTunnel(LinkDirectory(link), link.peer_id, tag=tag).run)
                        assert err.value.code == "lease_held" and "leased to coordinator" in str(err.value)
                    # A connect stream without the lease is reset.
                    async with b.open_stream({"kind": "tunnel", "service": TUNNEL_SERVICE, "op": "connect"}) as s:
                        with pytest.raises(StreamReset) as reset:
                            await s.receive()
                        assert reset.value.code == "not_leased"
                    held.cancel_scope.cancel()
                # The lease ended with its stream: b may take it now.
                await wait_until(lambda: server.holder() is None)
                assert server.leases() == []
                info_b = await nursery.start(RemoteWorkerTunnel(LinkDirectory(b), b.peer_id, tag="model-a").run)
                assert await roundtrip(info_b.endpoint, b"hello") == b"hello"
                assert server.counters["leases_refused"] == 2 and server.counters["connections_refused"] == 1
                nursery.cancel_scope.cancel()


async def test_worker_restart_revokes_the_lease(worker_node, clock) -> None:
    server, url, mesh = worker_node
    with trio.fail_after(TIMEOUT_S):
        async with open_link(url, LinkSettings(identity=SigningKey.generate(), mesh=mesh)) as a:
            tunnel = RemoteWorkerTunnel(LinkDirectory(a), a.peer_id, tag="m")
            async with trio.open_nursery() as nursery:
                await nursery.start(tunnel.run)
                await server.revoke("worker restarted")
                with trio.fail_after(5):  # run() returns once the worker node ended the lease
                    await wait_until(lambda: tunnel.ended is not None)
                assert "worker_restarted" in tunnel.ended and server.holder() is None


async def test_incompatible_worker_is_refused_clearly(nursery, autojump_clock) -> None:
    mesh = MeshSecret(bytes([0x42]) * 32)
    endpoint = await echo_server(nursery)
    server = RpcTunnelServer("w", lambda: (endpoint, "8.0.0", 1 << 30, "CPU"))  # a newer major version

    async def on_stream(link, header: dict[str, Any], stream) -> None:
        await server.handle(link, header, stream)

    listener = LinkListener(LinkSettings(identity=SigningKey.generate(), mesh=mesh, on_stream=on_stream))
    port = await nursery.start(listener.serve, "127.0.0.1", 0)
    with trio.fail_after(TIMEOUT_S):
        async with open_link(f"ws://127.0.0.1:{port}", LinkSettings(identity=SigningKey.generate(), mesh=mesh)) as a:
            with pytest.raises(TunnelError) as err:
                await nursery.start(RemoteWorkerTunnel(LinkDirectory(a), a.peer_id, tag="m").run)
            assert err.value.code == "incompatible" and "8.0.0 is incompatible with ours 7.0.0" in str(err.value)
            await wait_until(lambda: server.holder() is None)  # the refused lease is not kept
