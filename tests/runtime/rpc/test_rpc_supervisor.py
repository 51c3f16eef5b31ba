"""RpcWorkerSupervisor with real worker processes."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time

import pytest
import trio

from hydra_node.pidfile import read_pidfile, reap_stale
from hydra_node.runtime.rpc import RPC_PROTO, Backoff, RpcWorkerSupervisor, WorkerFailed, WorkerState, probe_worker

#: Worker start on a busy 2-core machine.
START_TIMEOUT = 60.0
QUICK = Backoff(initial_s=0.05, factor=2.0, max_s=0.2, jitter=0.25)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still "exists"; the supervisor must have reaped it
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


async def test_supervisor_starts_restarts_after_crash_and_stops():
    sup = RpcWorkerSupervisor(threads=1, max_memory_bytes=30_000_000, backoff=QUICK, rng=random.Random(1))
    assert sup.statistics().state is WorkerState.STARTING
    with trio.fail_after(2 * START_TIMEOUT):
        async with trio.open_nursery() as nursery:
            stats = await nursery.start(sup.run)
            assert stats.state is WorkerState.READY and stats.proto == str(RPC_PROTO)
            assert stats.free_bytes == 30_000_000 and stats.restarts == 0
            first_pid = stats.pid
            hello = await trio.to_thread.run_sync(probe_worker, stats.endpoint)
            assert hello.proto == RPC_PROTO

            os.kill(first_pid, signal.SIGKILL)
            again = await sup.wait_ready(min_restarts=1)
            assert again.restarts == 1 and again.endpoint == stats.endpoint
            assert again.pid != first_pid and not _alive(first_pid)
            nursery.cancel_scope.cancel()
    final = sup.statistics()
    assert final.state is WorkerState.STOPPED and final.pid is None
    assert not _alive(again.pid)


async def test_supervisor_fails_permanently_on_refused_arguments():
    sup = RpcWorkerSupervisor(max_memory_bytes=-5, backoff=QUICK)
    with trio.fail_after(START_TIMEOUT):
        async with trio.open_nursery() as nursery:
            with pytest.raises(WorkerFailed, match="refused to start.*must be positive"):
                await nursery.start(sup.run)
    assert sup.statistics().state is WorkerState.FAILED


async def test_supervisor_gives_up_after_repeated_start_failures():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        sup = RpcWorkerSupervisor(port=squatter.getsockname()[1], backoff=QUICK, max_start_failures=2)
        with trio.fail_after(2 * START_TIMEOUT):
            async with trio.open_nursery() as nursery:
                with pytest.raises(WorkerFailed, match="failed 2 times"):
                    await nursery.start(sup.run)
    stats = sup.statistics()
    assert stats.state is WorkerState.FAILED and stats.restarts == 1
    assert "cannot bind" in stats.last_error


def test_backoff_grows_caps_and_jitters():
    b = Backoff(initial_s=0.5, factor=2.0, max_s=4.0, jitter=0.25)
    assert [b.delay(n, 0.5) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.delay(0, 0.0) == pytest.approx(0.375) and b.delay(0, 0.999999) == pytest.approx(0.625, abs=1e-5)
    assert b.delay(10_000, 0.5) == 4.0


async def test_supervisor_reports_spawn_failure(tmp_path):
    sup = RpcWorkerSupervisor(python=str(tmp_path / "no-such-python"))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            with pytest.raises(WorkerFailed, match="cannot spawn"):
                await nursery.start(sup.run)
    assert sup.statistics().state is WorkerState.FAILED


#: A node stand-in: supervises one worker, prints its pid, waits to be killed.
_PARENT = """
import sys, trio
from pathlib import Path
from hydra_node.runtime.rpc import RpcWorkerSupervisor
async def main():
    sup = RpcWorkerSupervisor(threads=1, max_memory_bytes=30_000_000, pidfile=Path(sys.argv[1]))
    async with trio.open_nursery() as nursery:
        stats = await nursery.start(sup.run)
        print(stats.pid, flush=True)
trio.run(main)
"""


def test_worker_dies_with_a_kill_9d_node_and_its_pid_file_is_reaped(tmp_path):
    pidfile = tmp_path / "run" / "rpc-worker.pid"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(pidfile)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        rec = read_pidfile(pidfile)
        assert rec.pid == worker and rec.kind == "rpc-worker" and rec.owner_pid == parent.pid and _alive(worker)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 5
        while _gone_or_zombie(worker) is False and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone_or_zombie(worker), "the RPC worker survived a kill -9 of its node"
        assert reap_stale(pidfile.parent) == [f"removed stale pid file rpc-worker.pid (pid {worker} gone)"]
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()


def _gone_or_zombie(pid: int) -> bool:
    """A worker orphaned by the kill may stay a zombie where nothing reaps reparented children."""
    try:
        return not _alive(pid)
    except FileNotFoundError:
        return True
