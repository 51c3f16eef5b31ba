"""Trio supervisor for one RPC worker process: spawn, await readiness, restart, stop.

    sup = RpcWorkerSupervisor(threads=2, max_memory_bytes=4 << 30, pidfile=home / "run" / "rpc-worker.pid")
    stats = await nursery.start(sup.run)      # returns once the worker is ready
    stats.endpoint, stats.proto, stats.free_bytes

The node's one child supervisor (:mod:`hydra_node.runtime.supervise`) does the work; this
module says how a worker is started and how its readiness line is read.  Crashes after
readiness are restarted with exponential back-off and jitter, on the same port
(coordinators hold the endpoint).  A worker that keeps dying before it is ready, or refuses
its arguments, ends in ``failed`` and :class:`WorkerFailed` is raised from ``run``.  On
cancellation: SIGTERM, a grace period, SIGKILL, always wait.  The worker dies with the node.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import trio

from hydra_node.backoff import Backoff, CrashLoop
from hydra_node.runtime.supervise import (
    ChildFailed,
    ChildNotReady,
    ChildOutput,
    ChildSpec,
    ChildState,
    ChildSupervisor,
    GiveUp,
)

from hydra_node.runtime.rpc.readiness import MAX_READINESS_LINE, BadReadiness, Readiness, StartFailure, parse_readiness
from hydra_node.runtime.rpc.worker import LOOPBACK, READY_TIMEOUT_S

__all__ = ["Backoff", "RpcWorkerSupervisor", "WorkerFailed", "WorkerState", "WorkerStatistics", "free_loopback_port"]

log = logging.getLogger(__name__)

_READ_CHUNK = 4096

#: The worker's states are the supervisor's: starting, ready, restarting, failed, stopped.
WorkerState = ChildState


class WorkerFailed(Exception):
    """The worker cannot be (re)started; the message carries its last words."""


@dataclass(frozen=True)
class WorkerStatistics:
    state: WorkerState
    endpoint: str
    proto: str | None
    free_bytes: int
    total_bytes: int
    device: str | None
    restarts: int
    pid: int | None
    last_error: str | None


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class RpcWorkerSupervisor:
    """Keeps one loopback RPC worker process alive; see the module docstring."""

    def __init__(
        self,
        *,
        port: int = 0,
        threads: int = 1,
        cache_dir: str | None = None,
        max_memory_bytes: int | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        backoff: Backoff = Backoff(),
        max_start_failures: int = 5,
        stable_after_s: float = 30.0,
        grace_s: float = 5.0,
        rng: random.Random | None = None,
        python: str = sys.executable,
        pidfile: Path | None = None,
    ):
        self._port = port or free_loopback_port()
        argv = [
            python,
            "-m",
            "hydra_node.runtime.rpc.worker",
            "--host",
            LOOPBACK,
            "--port",
            str(self._port),
            "--threads",
            str(threads),
        ]
        if cache_dir:
            argv += ["--cache-dir", cache_dir]
        if max_memory_bytes:
            argv += ["--max-memory-bytes", str(max_memory_bytes)]
        self._ready_timeout = ready_timeout_s
        self._output = ChildOutput()
        self._ready: Readiness | None = None
        spec = ChildSpec(
            argv,
            ready=self._await_readiness,
            kind="rpc-worker",
            stdout=subprocess.PIPE,
            output=self._output,
            pidfile=pidfile,
            grace_s=grace_s,
        )
        self._child = ChildSupervisor(
            "RPC worker",
            spec,
            backoff=dataclasses.replace(backoff, reset_after_s=stable_after_s),
            crash_loop=CrashLoop(max_start_failures),
            forgive_when_ready=True,
            on_ready=self._on_ready,
            rng=rng,
        )

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self._port}"

    def statistics(self) -> WorkerStatistics:
        c = self._child
        r = self._ready if c.state is WorkerState.READY else None
        return WorkerStatistics(
            c.state,
            self.endpoint,
            str(r.proto) if r else None,
            r.free_bytes if r else 0,
            r.total_bytes if r else 0,
            r.device if r else None,
            c.restarts,
            c.pid,
            c.last_error,
        )

    async def wait_ready(self, *, min_restarts: int = 0) -> WorkerStatistics:
        """Wait until the worker is ready after at least ``min_restarts`` restarts."""
        c = self._child
        while not (c.state is WorkerState.READY and c.restarts >= min_restarts):
            if c.state in (WorkerState.FAILED, WorkerState.STOPPED):
                raise WorkerFailed(c.last_error or f"worker {c.state.value}")
            await c.wait_changed()
        return self.statistics()

    async def run(self, *, task_status: trio.TaskStatus[WorkerStatistics] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._child.run(task_status=task_status)
        except ChildFailed as exc:
            if exc.reason is GiveUp.SPAWN:
                raise WorkerFailed(exc.last_error) from exc
            if exc.reason is GiveUp.REFUSED:
                raise WorkerFailed(f"RPC worker refused to start: {exc.last_error}") from None
            raise WorkerFailed(
                f"RPC worker failed {exc.failures} times before becoming ready; last error: {exc.last_error}"
            ) from None

    def _on_ready(self, ready: Readiness) -> WorkerStatistics:
        self._ready = ready
        log.info(
            "event=rpc_worker_ready endpoint=%s proto=%s pid=%s restarts=%d",
            ready.endpoint,
            ready.proto,
            self._child.pid,
            self._child.restarts,
        )
        return self.statistics()

    async def _await_readiness(self, proc: trio.Process) -> Readiness:
        """The worker's readiness line; :class:`ChildNotReady` for a failure, timeout, early exit or garbage."""
        buf = bytearray()
        assert proc.stdout is not None  # spawned with its stdout piped to us
        with trio.move_on_after(self._ready_timeout):
            while b"\n" not in buf:
                if len(buf) > MAX_READINESS_LINE:
                    raise ChildNotReady(f"worker printed more than {MAX_READINESS_LINE} bytes without a newline")
                chunk = await proc.stdout.receive_some(_READ_CHUNK)
                if not chunk:
                    await proc.wait()
                    raise ChildNotReady(
                        f"worker exited with status {proc.returncode} before readiness: {self._output.tail()}"
                    )
                buf += chunk
            try:
                outcome = parse_readiness(bytes(buf.split(b"\n", 1)[0]))
            except BadReadiness as exc:
                raise ChildNotReady(f"bad readiness line: {exc}") from None
            if isinstance(outcome, StartFailure):
                raise ChildNotReady(outcome.error, permanent=outcome.permanent)
            if outcome.endpoint != self.endpoint:
                raise ChildNotReady(f"worker reports endpoint {outcome.endpoint}, expected {self.endpoint}")
            return outcome
        raise ChildNotReady(f"worker not ready after {self._ready_timeout} s: {self._output.tail()}")
