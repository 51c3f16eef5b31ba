"""Helpers for the RPC tests (a uniquely named module, importable from the test files)."""

from __future__ import annotations

import json
import select
import subprocess
import time
from pathlib import Path

CHILD = Path(__file__).with_name("coordinator_child.py")
#: Bound on a worker's readiness line in tests (2 busy cores shared with others).
WORKER_READY_TIMEOUT = 60.0


def read_json_line(proc: subprocess.Popen, timeout: float) -> dict:
    """Next stdout line of ``proc`` as JSON, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no line from child process in time")
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if ready:
            line = proc.stdout.readline()
            if not line:
                raise EOFError(f"child exited with {proc.wait(5)}")
            return json.loads(line)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
