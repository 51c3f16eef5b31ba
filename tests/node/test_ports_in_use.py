"""A port already in use stops `serve` at once, before any mesh work, with one line naming the port,
what it is for and the option that moves it (hydra_node/listen.py; docs/operations.md#ports).

Real `hydra-node serve` processes on loopback; the ports are held by plain listening sockets or by a
running node.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness import NodeProcess

#: Log events of any mesh work: creating, joining or serving a mesh.
MESH_EVENTS = ("event=mesh_created", "event=mesh_joined", "event=mesh_ready", "event=link_up", "event=link_listener_up")


def serve(home: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """``hydra-node serve --no-model`` on loopback with every port free (0) unless ``args`` say otherwise."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "hydra_node.cli",
            "serve",
            "--home",
            str(home),
            "--no-model",
            "--port",
            "0",
            "--console",
            "0",
            "--mesh-host",
            "127.0.0.1",
            "--mesh-port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def held_port() -> socket.socket:
    """A plain socket listening on 127.0.0.1 at a free port (close it when done)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def assert_refused(r: subprocess.CompletedProcess, port: int, what: str, option: str) -> None:
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    assert r.returncode == 1, r.stderr[-3000:]
    assert last == (
        f"hydra-node: port {port} on 127.0.0.1 ({what}) is in use: another hydra-node or program "
        f"holds it; stop it or choose another port with {option} N"
    ), r.stderr[-3000:]
    assert not [e for e in MESH_EVENTS if e in r.stderr], r.stderr[-3000:]  # nothing of the mesh before it
    assert "Traceback" not in r.stderr and "Errno" not in r.stderr


@pytest.mark.parametrize(
    "option, what",
    [
        ("--port", "the OpenAI API"),
        ("--console", "the management API and console"),
        ("--mesh-port", "the mesh's peer links"),
        ("--tunnel-port", "the data port of RPC tunnels"),
    ],
)
def test_a_port_in_use_stops_the_start_naming_port_and_option(tmp_path, option, what):
    sock = held_port()
    try:
        port = sock.getsockname()[1]
        r = serve(tmp_path / "home", option, str(port))
    finally:
        sock.close()
    assert_refused(r, port, what, option)
    assert not (tmp_path / "home" / "run" / "node.pid").exists()  # the start cleaned up after itself


def test_a_second_node_on_the_ports_of_a_running_one_fails_before_joining(tmp_path):
    first = NodeProcess(tmp_path / "first", "--no-model").start()
    try:
        st = first.status()
        mesh_port, token = st["mesh"]["port"], first.invite()
        # every port the same as the running node's: the first one bound (the OpenAI API) is named
        r = serve(
            tmp_path / "second",
            "--port",
            str(first.api_port),
            "--console",
            str(first.console_port),
            "--mesh-port",
            str(mesh_port),
            "--join",
            token,
        )
        assert_refused(r, first.api_port, "the OpenAI API", "--port")
        # only the mesh port the same, joining the running node's mesh: refused before the admission
        # (the old order joined first, logged mesh_joined, and only then failed to listen)
        r = serve(tmp_path / "second", "--mesh-port", str(mesh_port), "--join", token)
        assert_refused(r, mesh_port, "the mesh's peer links", "--mesh-port")
        st = first.status()
        assert st["node_state"] == "serving" and st["peers"] == [], st["peers"]  # nobody joined it
    finally:
        first.kill_all()
