"""The worker process: readiness line, loopback-only binding, SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from rpc_helpers import read_json_line

from hydra_node.runtime.rpc import RPC_PROTO, WorkerUnreachable, probe_worker
from hydra_node.runtime.rpc.probe import parse_endpoint


def _listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses listening on ``port`` (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in list(f)[1:]:
                local, state = row.split()[1], row.split()[3]
                addr, p = local.split(":")
                if int(p, 16) == port and state == "0A":  # LISTEN
                    found.add(addr)
    return found


def test_worker_reports_ready_binds_loopback_and_stops_on_sigterm(start_worker):
    proc, ready = start_worker(max_memory_bytes=50_000_000)
    assert ready["ready"] is True and ready["proto"] == str(RPC_PROTO) == "7.0.0"
    assert ready["free_bytes"] == ready["total_bytes"] == 50_000_000  # capped by --max-memory-bytes
    assert ready["device"] == "CPU" and ready["pid"] == proc.pid
    host, port = parse_endpoint(ready["endpoint"])
    assert host == "127.0.0.1"
    assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, nothing else

    hello = probe_worker(ready["endpoint"])
    assert hello.proto == RPC_PROTO and hello.n_devices == 1 and hello.total_bytes > 50_000_000

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    with pytest.raises(WorkerUnreachable):
        probe_worker(ready["endpoint"], timeout=1.0)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "localhost", "::"])
def test_worker_refuses_non_loopback_host(host):
    proc = subprocess.run(
        [sys.executable, "-m", "hydra_node.runtime.rpc.worker", "--host", host, "--port", "50999"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    line = json.loads(proc.stdout)
    assert line["ready"] is False and line["permanent"] is True
    assert "127.0.0.1 only" in line["error"] and "refusing to bind" in proc.stderr


def test_worker_reports_port_in_use(spawn):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = spawn([sys.executable, "-m", "hydra_node.runtime.rpc.worker", "--port", str(port)])
        line = read_json_line(proc, 60)
        assert line["ready"] is False and line["permanent"] is False and "cannot bind" in line["error"]
        assert proc.wait(10) == 1
