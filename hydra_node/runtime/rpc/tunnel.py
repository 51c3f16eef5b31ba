"""llama.cpp RPC through encrypted mesh tunnels, and worker leases.

Workers listen on 127.0.0.1 only.  A coordinator reaches a remote worker like this::

    runner (llama.cpp) ──TCP──▶ 127.0.0.1:T  (RemoteWorkerTunnel, coordinator node)
        ══ mesh stream {"kind": "tunnel", "service": "rpc", "op": "connect"} ══▶
    worker node (RpcTunnelServer) ──TCP──▶ 127.0.0.1:W (its RPC worker)

Before any ``connect`` stream, the coordinator holds a **lease stream**
(``"op": "lease"``) to the worker's node: the worker node grants it to one coordinator
at a time (a second gets the stream reset with code ``lease_held`` and a message naming
the holder) and answers with one control message describing the worker (``proto``,
``free_bytes``, ``device``; :mod:`.lease_wire`, the tunnel's sans-IO control codec).
The lease lasts exactly as long as that stream: the coordinator ending it, the link
closing, or the worker node restarting its worker all end it.  ``connect`` streams from
anyone but the holder are reset (``not_leased``).

This module is the public surface; the parts live in sibling modules, one job each:

* :mod:`.tunnel_client` – the coordinator side: :class:`RemoteWorkerTunnel` holds a lease
  and a loopback listener for llama.cpp (``LeasedWorker``, ``TunnelError``).
* :mod:`.tunnel_server` – the worker side: :class:`RpcTunnelServer` grants the lease and
  serves ``connect`` streams to the local worker.
* :mod:`.tunnel_splice` – pumping bytes between a TCP connection and a mesh stream or a
  direct data connection (``splice``, ``splice_data``), cut at ggml RPC message ends.
* :mod:`.tunnel_control` – the stream header's service name, the tag bound and reading one
  :mod:`.lease_wire` control message from a stream.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from hydra_node.runtime.rpc.tunnel_client import (
    ACCEPT_RETRY_S,
    LEASE_TIMEOUT_S,
    MAX_CONNECTIONS_PER_TUNNEL,
    LeasedWorker,
    LinkDialer,
    RemoteWorkerTunnel,
    TunnelError,
)
from hydra_node.runtime.rpc.tunnel_control import MAX_TAG_CHARS, PATH_CHOICE_TIMEOUT_S, TUNNEL_SERVICE, read_control
from hydra_node.runtime.rpc.tunnel_server import LOCAL_CONNECT_TIMEOUT_S, RpcTunnelServer
from hydra_node.runtime.rpc.tunnel_splice import PUMP_CHUNK_BYTES, splice, splice_data

__all__ = [
    "ACCEPT_RETRY_S",
    "LEASE_TIMEOUT_S",
    "LOCAL_CONNECT_TIMEOUT_S",
    "MAX_CONNECTIONS_PER_TUNNEL",
    "MAX_TAG_CHARS",
    "PATH_CHOICE_TIMEOUT_S",
    "PUMP_CHUNK_BYTES",
    "TUNNEL_SERVICE",
    "LeasedWorker",
    "LinkDialer",
    "RemoteWorkerTunnel",
    "RpcTunnelServer",
    "TunnelError",
    "TunnelHandler",
    "read_control",
    "splice",
    "splice_data",
]

#: What a node calls for each incoming ``tunnel`` stream: ``handler(link, header, stream)``.
TunnelHandler = Callable[[object, dict, object], Awaitable[None]]
