"""Fixtures for the RPC tests: real worker processes on loopback, always reaped."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rpc_helpers import CHILD, WORKER_READY_TIMEOUT, read_json_line, stop

from hydra_node.runtime.rpc.supervisor import free_loopback_port


@pytest.fixture
def spawn():
    """``spawn(argv) -> Popen`` with stdout/stderr piped; every process is reaped."""
    procs: list[subprocess.Popen] = []

    def _spawn(argv: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        return p

    yield _spawn
    for p in procs:
        stop(p)
        for s in (p.stdout, p.stderr):
            s.close()


@pytest.fixture
def start_worker(spawn):
    """``start_worker(max_memory_bytes=...) -> (Popen, readiness dict)``."""

    def _start(max_memory_bytes: int | None = 40_000_000, threads: int = 1):
        argv = [
            sys.executable,
            "-m",
            "hydra_node.runtime.rpc.worker",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_loopback_port()),
            "--threads",
            str(threads),
        ]
        if max_memory_bytes:
            argv += ["--max-memory-bytes", str(max_memory_bytes)]
        proc = spawn(argv)
        return proc, read_json_line(proc, WORKER_READY_TIMEOUT)

    return _start


@pytest.fixture
def run_child(spawn):
    """``run_child(spec) -> Popen`` running coordinator_child.py."""

    def _run(spec: dict) -> subprocess.Popen:
        return spawn([sys.executable, str(CHILD), json.dumps(spec)])

    return _run
