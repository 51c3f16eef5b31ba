"""Trio supervisor for one RPC worker process: spawn, await readiness, restart, stop.

    sup = RpcWorkerSupervisor(threads=2, max_memory_bytes=4 << 30)
    stats = await nursery.start(sup.run)      # returns once the worker is ready
    stats.endpoint, stats.proto, stats.free_bytes

Crashes after readiness are restarted with exponential back-off and jitter, on the
same port (coordinators hold the endpoint).  A worker that keeps dying before it is
ready, or refuses its arguments, ends in ``failed`` and :class:`WorkerFailed` is raised
from ``run``.  On cancellation: SIGTERM, a grace period, SIGKILL, always wait.
"""

from __future__ import annotations

import collections
import enum
import logging
import random
import socket
import subprocess
import sys
from dataclasses import dataclass

import trio

from .readiness import MAX_READINESS_LINE, BadReadiness, Readiness, StartFailure, parse_readiness
from .worker import LOOPBACK, READY_TIMEOUT_S

log = logging.getLogger(__name__)

#: Stderr lines kept for error reports.
STDERR_TAIL_LINES = 40
_READ_CHUNK = 4096


class WorkerState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


class WorkerFailed(Exception):
    """The worker cannot be (re)started; the message carries its last words."""


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.25  # +-25 %

    def delay(self, attempt: int, u: float) -> float:
        """Delay before restart number ``attempt`` (0-based); ``u`` uniform in [0, 1)."""
        base = min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))
        return base * (1.0 - self.jitter + 2.0 * self.jitter * u)


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

    def __init__(self, *, port: int = 0, threads: int = 1, cache_dir: str | None = None,
                 max_memory_bytes: int | None = None, ready_timeout_s: float = READY_TIMEOUT_S,
                 backoff: Backoff = Backoff(), max_start_failures: int = 5,
                 stable_after_s: float = 30.0, grace_s: float = 5.0,
                 rng: random.Random | None = None, python: str = sys.executable):
        self._port = port or free_loopback_port()
        self._argv = [python, "-m", "hydra_node.runtime.rpc.worker", "--host", LOOPBACK,
                      "--port", str(self._port), "--threads", str(threads)]
        if cache_dir:
            self._argv += ["--cache-dir", cache_dir]
        if max_memory_bytes:
            self._argv += ["--max-memory-bytes", str(max_memory_bytes)]
        self._ready_timeout = ready_timeout_s
        self._backoff = backoff
        self._max_start_failures = max_start_failures
        self._stable_after = stable_after_s
        self._grace = grace_s
        self._rng = rng or random.Random()
        self._state = WorkerState.STARTING
        self._ready: Readiness | None = None
        self._restarts = 0
        self._pid: int | None = None
        self._last_error: str | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._changed = trio.Event()

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self._port}"

    def statistics(self) -> WorkerStatistics:
        r = self._ready if self._state is WorkerState.READY else None
        return WorkerStatistics(self._state, self.endpoint, str(r.proto) if r else None,
                                r.free_bytes if r else 0, r.total_bytes if r else 0,
                                r.device if r else None, self._restarts, self._pid, self._last_error)

    async def wait_ready(self, *, min_restarts: int = 0) -> WorkerStatistics:
        """Wait until the worker is ready after at least ``min_restarts`` restarts."""
        while not (self._state is WorkerState.READY and self._restarts >= min_restarts):
            if self._state in (WorkerState.FAILED, WorkerState.STOPPED):
                raise WorkerFailed(self._last_error or f"worker {self._state.value}")
            await self._changed.wait()
        return self.statistics()

    def _set(self, state: WorkerState) -> None:
        self._state = state
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        started, failures, attempt = False, 0, 0
        try:
            while True:
                up_since, permanent = None, False
                try:
                    proc = await trio.lowlevel.open_process(
                        self._argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                except OSError as exc:
                    self._last_error = f"cannot spawn RPC worker: {exc}"
                    self._set(WorkerState.FAILED)
                    raise WorkerFailed(self._last_error) from exc
                self._pid = proc.pid
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._drain_stderr, proc.stderr)
                        outcome = await self._await_readiness(proc)
                        if isinstance(outcome, Readiness):
                            self._ready, failures, up_since = outcome, 0, trio.current_time()
                            self._set(WorkerState.READY)
                            log.info("event=rpc_worker_ready endpoint=%s proto=%s pid=%s restarts=%d",
                                     outcome.endpoint, outcome.proto, proc.pid, self._restarts)
                            if not started:
                                started = True
                                task_status.started(self.statistics())
                            nursery.start_soon(self._drain, proc.stdout)
                            await proc.wait()
                            self._last_error = f"worker exited with status {proc.returncode}: {self._tail()}"
                            self._set(WorkerState.RESTARTING)
                        elif isinstance(outcome, StartFailure):
                            failures += 1
                            self._last_error, permanent = outcome.error, outcome.permanent
                        else:
                            failures += 1
                            self._last_error = outcome
                        nursery.cancel_scope.cancel()
                finally:
                    await self._stop(proc)
                if permanent or failures >= self._max_start_failures:
                    self._set(WorkerState.FAILED)
                    raise WorkerFailed(
                        f"RPC worker refused to start: {self._last_error}" if permanent else
                        f"RPC worker failed {failures} times before becoming ready; "
                        f"last error: {self._last_error}")
                if up_since is not None and trio.current_time() - up_since >= self._stable_after:
                    attempt = 0
                self._set(WorkerState.RESTARTING)
                delay = self._backoff.delay(attempt, self._rng.random())
                log.warning("event=rpc_worker_restart endpoint=%s in_s=%.2f error=%r",
                            self.endpoint, delay, self._last_error)
                await trio.sleep(delay)
                attempt += 1
                self._restarts += 1
        finally:
            if self._state is not WorkerState.FAILED:
                self._set(WorkerState.STOPPED)

    async def _await_readiness(self, proc: trio.Process) -> Readiness | StartFailure | str:
        """The readiness event, or an error string (timeout, early exit, garbage)."""
        buf = bytearray()
        with trio.move_on_after(self._ready_timeout):
            while b"\n" not in buf:
                if len(buf) > MAX_READINESS_LINE:
                    return f"worker printed more than {MAX_READINESS_LINE} bytes without a newline"
                chunk = await proc.stdout.receive_some(_READ_CHUNK)
                if not chunk:
                    await proc.wait()
                    return f"worker exited with status {proc.returncode} before readiness: {self._tail()}"
                buf += chunk
            try:
                outcome = parse_readiness(bytes(buf.split(b"\n", 1)[0]))
            except BadReadiness as exc:
                return f"bad readiness line: {exc}"
            if isinstance(outcome, Readiness) and outcome.endpoint != self.endpoint:
                return f"worker reports endpoint {outcome.endpoint}, expected {self.endpoint}"
            return outcome
        return f"worker not ready after {self._ready_timeout} s: {self._tail()}"

    async def _drain(self, stream) -> None:
        while await stream.receive_some(_READ_CHUNK):
            pass

    async def _drain_stderr(self, stream) -> None:
        partial = b""
        while chunk := await stream.receive_some(_READ_CHUNK):
            *lines, partial = (partial + chunk).split(b"\n")
            partial = partial[-_READ_CHUNK:]
            self._stderr.extend(line.decode(errors="replace")[:500] for line in lines)

    def _tail(self) -> str:
        return " | ".join(list(self._stderr)[-5:])

    async def _stop(self, proc: trio.Process) -> None:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.terminate()
                with trio.move_on_after(self._grace):
                    await proc.wait()
            if proc.returncode is None:
                proc.kill()
                with trio.move_on_after(self._grace):
                    await proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    await stream.aclose()
        self._pid = None
