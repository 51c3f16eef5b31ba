"""Benchmark nodes in network namespaces (root only): each node in its own namespace on the bridge of
tests/netlab.py, reached from the benchmark through loopback forwarders.

A :class:`NetnsNode` is a ``harness.NodeProcess`` whose ``serve`` runs under ``ip netns exec``
with its standard ports inside its namespace, links on ``0.0.0.0`` advertised on its bridge
address. Its ``api_port`` and ``console_port`` are ports on this process's loopback that forward
each connection into the namespace's loopback (:class:`NetnsForward`: the upstream socket is
created by a thread that entered the namespace with ``setns(2)``, so it lives there), so every
harness helper (status, invite, /api/events, streaming) works unchanged. The mesh links between
nodes cross the bridge: real network stacks, one per node.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import sys
import threading
from pathlib import Path

from harness import NodeProcess  # tests/, on the path through _common
from netlab import NetLab

__all__ = ["NetLab", "NetnsForward", "NetnsNode", "netns_unavailable"]

CLONE_NEWNET = 0x40000000
NS_API_PORT, NS_CONSOLE_PORT, NS_MESH_PORT = 9337, 3131, 9338


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or use --latency-ms on loopback)"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip`"
    return None


def _enter_netns(ns: str) -> None:
    """Move the calling thread (only it) into network namespace ``ns``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


class NetnsForward:
    """Listens on 127.0.0.1 (``port``) here; each connection is piped to 127.0.0.1:``target``
    inside network namespace ``ns``. Daemon threads: they end with the benchmark."""

    def __init__(self, ns: str, target: int):
        self.ns, self.target = ns, target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            _enter_netns(self.ns)  # this thread only; the socket below is created in the namespace
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=30)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        back = threading.Thread(target=self._pipe, args=(upstream, client), daemon=True)
        back.start()
        self._pipe(client, upstream)
        back.join()
        client.close()
        upstream.close()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:  # a killed node resets its side: end both
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


class NetnsNode(NodeProcess):
    """``hydra-node serve`` on host ``index`` (1-based) of ``lab``; see the module docstring."""

    def __init__(self, lab: NetLab, index: int, home: Path, *args: str):
        super().__init__(home, *args)
        self.lab, self.index = lab, index
        self.ns = lab.hosts[index - 1]
        self.address = lab.addr(index)
        self._api = NetnsForward(self.ns, NS_API_PORT)
        self._console = NetnsForward(self.ns, NS_CONSOLE_PORT)

    def command_line(self) -> list[str]:
        return [
            *("ip", "netns", "exec", self.ns),  # it execs the node: the pid is the node's
            *(sys.executable, "-m", "hydra_node.cli", "serve", "--home", str(self.home)),
            *("--port", str(NS_API_PORT), "--console", str(NS_CONSOLE_PORT)),
            *("--mesh-host", "0.0.0.0", "--mesh-port", str(NS_MESH_PORT), "--advertise", self.address),
            *self.args,
        ]

    def wait_ready(self, timeout: float | None = None) -> None:
        super().wait_ready() if timeout is None else super().wait_ready(timeout)
        self.api_port, self.console_port = self._api.port, self._console.port
