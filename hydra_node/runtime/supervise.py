"""The node's one child-process supervisor (model runners, RPC workers, draft servers).

    spec = ChildSpec(argv, ready=read_ready_line, kind="rpc-worker", pidfile=run_dir / "rpc-worker.pid",
                     stdout=subprocess.PIPE, output=ChildOutput())
    child = ChildSupervisor("RPC worker", spec, backoff=Backoff(), crash_loop=CrashLoop(5))
    first = await nursery.start(child.run)   # what ``on_ready`` returned, once the child is ready

One life of a child, the way ``trio.run_process`` does it: spawn outside the nursery (a spawn
failure is seen at once), then in one nursery pump its stderr into :class:`ChildOutput`, await
the spec's readiness reader, and once ready its ``watch`` (by default: drain stdout and wait for
the exit).  On any exit, cancellation included: terminate, a grace period, kill, always wait,
then remove the pid file.  Children die with the node (``PR_SET_PDEATHSIG``, see ``_spawn``), and
a pid file lets the next start find any that did not (``hydra_node.pidfile.reap_stale``).

Between lives the :class:`~hydra_node.backoff.Backoff` delay; when the
:class:`~hydra_node.backoff.CrashLoop` says so, or the child refuses its arguments,
the state becomes ``failed`` and :class:`ChildFailed` says why.
"""

from __future__ import annotations

import collections
import enum
import logging
import random
import socket
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from hydra_node.backoff import Backoff, CrashLoop
from hydra_node.pidfile import remove_pidfile, write_pidfile

from hydra_node.runtime._spawn import describe_returncode, open_child_process, stop_process

__all__ = [
    "ChildState",
    "GiveUp",
    "ChildNotReady",
    "ChildExited",
    "ChildFailed",
    "ChildOutput",
    "ChildSpec",
    "ChildSupervisor",
]

log = logging.getLogger("hydra.supervise")

#: Grace period between SIGTERM and SIGKILL.
DEFAULT_GRACE_S = 3.0
#: Stderr lines kept for error messages, and the longest kept line.
TAIL_LINES = 40
MAX_TAIL_LINE_CHARS = 500
_READ_CHUNK = 65536


class ChildState(enum.StrEnum):
    STARTING = "starting"  # before the first readiness
    READY = "ready"
    RESTARTING = "restarting"  # exited; waiting out the back-off, then starting again
    FAILED = "failed"  # given up (see ChildFailed)
    STOPPED = "stopped"  # run() ended


class GiveUp(enum.StrEnum):
    """Why a supervisor stopped restarting its child."""

    SPAWN = "spawn"  # the program could not be started at all
    REFUSED = "refused"  # the child said retrying cannot help (bad arguments, no support)
    FIRST_START = "first_start"  # it never became ready and the supervisor was told not to retry that
    CRASH_LOOP = "crash_loop"  # too many crashes (see CrashLoop)


class ChildNotReady(Exception):
    """Raised by a readiness reader: the child will not become ready (this time)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class ChildExited(Exception):
    """Raised by a ``watch``: the ready child is gone (the message says how)."""


class ChildFailed(Exception):
    """The supervisor gave up; ``reason`` says why, ``last_error`` is the child's last words."""

    def __init__(self, reason: GiveUp, last_error: str, failures: int) -> None:
        super().__init__(f"{reason.value}: {last_error}")
        self.reason = reason
        self.last_error = last_error
        self.failures = failures


class ChildOutput:
    """A child's stderr: appended to ``logfile`` (when given), its last lines kept for errors."""

    def __init__(self, logfile: Path | None = None, tail_lines: int = TAIL_LINES) -> None:
        self.logfile = logfile
        self.lines: collections.deque[str] = collections.deque(maxlen=tail_lines)

    def tail(self, n: int = 5) -> str:
        return " | ".join(list(self.lines)[-n:])

    async def pump(self, stream: trio.abc.ReceiveStream) -> None:
        logf = None
        if self.logfile is not None:
            self.logfile.parent.mkdir(parents=True, exist_ok=True)
            logf = open(self.logfile, "ab")
        try:
            partial = b""
            while data := await stream.receive_some(_READ_CHUNK):
                if logf is not None:
                    logf.write(data)
                    logf.flush()
                *lines, partial = (partial + data).split(b"\n")
                partial = partial[-_READ_CHUNK:]
                self.lines.extend(line.decode("utf-8", "replace")[:MAX_TAIL_LINE_CHARS] for line in lines)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        finally:
            if logf is not None:
                logf.close()


ReadinessReader = Callable[[trio.Process], Awaitable[Any]]
Watch = Callable[[trio.Process, Any], Awaitable[None]]


@dataclass(frozen=True)
class ChildSpec:
    """How to start one life of a child and how to tell that it is ready.

    ``ready`` reads the child's output or channel and returns when it is ready (its value
    goes to ``on_ready``), or raises :class:`ChildNotReady`; it bounds its own wait.
    ``watch`` runs while the child is ready and returns (or raises :class:`ChildExited`)
    when it is gone; the default drains stdout and waits for the exit.
    """

    argv: Sequence[str]
    ready: ReadinessReader
    kind: str = "child"
    stdout: int | None = subprocess.DEVNULL
    output: ChildOutput | None = None  # None: stderr is /dev/null
    #: Sockets the child inherits (pass their fd numbers in ``argv``); ours are closed once it runs.
    handover: tuple[socket.socket, ...] = ()
    pidfile: Path | None = None
    watch: Watch | None = None
    #: Called once the child is gone (or failed to start): e.g. close our end of its channel.
    on_exit: Callable[[], None] | None = None
    grace_s: float = DEFAULT_GRACE_S


class ChildSupervisor:
    """Keeps one child alive: spawn, readiness, watch, stop, back-off, give up.

    ``spec`` is a :class:`ChildSpec`, or an async callable building one before every spawn
    (it may raise :class:`ChildNotReady`).  ``fatal_first_start``: a child that was never
    ready is not retried.  ``crash_loop`` counts every exit, or with ``forgive_when_ready``
    only failures to become ready, in a row (readiness resets it).
    """

    def __init__(
        self,
        name: str,
        spec: ChildSpec | Callable[[], Awaitable[ChildSpec]],
        *,
        backoff: Backoff = Backoff(),
        crash_loop: CrashLoop | None = None,
        fatal_first_start: bool = False,
        forgive_when_ready: bool = False,
        on_ready: Callable[[Any], Any] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self._spec = spec
        self.backoff = backoff.schedule()
        self.crash_loop = crash_loop
        self.fatal_first_start = fatal_first_start
        self.forgive_when_ready = forgive_when_ready
        self._on_ready = on_ready
        self._rng = rng or random.Random()
        self.state = ChildState.STARTING
        self.restarts = 0
        self.failures = 0  # exits counted by the crash loop since its last reset
        self.last_error: str | None = None
        self.ever_ready = False
        self._proc: trio.Process | None = None
        self._task_status: trio.TaskStatus[Any] | None = None
        self._changed = trio.Event()

    # ---- what callers see ------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def wait_changed(self) -> None:
        """Return at the next state change (or restart)."""
        await self._changed.wait()

    def kill(self) -> bool:
        """Kill the current child now (it is stuck); supervision restarts it.  False if none."""
        if self._proc is None or self._proc.returncode is not None:
            return False
        self._proc.kill()
        return True

    def _set(self, state: ChildState) -> None:
        self.state = state
        self._changed.set()
        self._changed = trio.Event()

    # ---- supervision -----------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the child until cancelled; ``task_status.started(on_ready(value))`` at its first
        readiness.  Raises :class:`ChildFailed` when it gives up (state ``failed``)."""
        self._task_status = task_status
        try:
            while True:
                error, permanent, was_ready = await self._life()
                self.last_error = error
                now = trio.current_time()
                if permanent:
                    self._give_up(GiveUp.REFUSED)
                if not self.ever_ready and self.fatal_first_start:
                    self._give_up(GiveUp.FIRST_START)
                if self.crash_loop is not None and not (was_ready and self.forgive_when_ready):
                    looping = self.crash_loop.record(now)
                    self.failures = self.crash_loop.count(now)
                    if looping:
                        self._give_up(GiveUp.CRASH_LOOP)
                delay = self.backoff.next_delay(now, self._rng.random())
                self._set(ChildState.RESTARTING)
                log.warning(
                    "event=child_restart child=%r in_s=%.2f restarts=%d error=%r",
                    self.name,
                    delay,
                    self.restarts + 1,
                    error,
                )
                await trio.sleep(delay)
                self.restarts += 1
        finally:
            self._task_status = None
            if self.state is not ChildState.FAILED:
                self._set(ChildState.STOPPED)

    def _give_up(self, reason: GiveUp) -> None:
        self._set(ChildState.FAILED)
        log.error(
            "event=child_failed child=%r reason=%s restarts=%d error=%r",
            self.name,
            reason.value,
            self.restarts,
            self.last_error,
        )
        raise ChildFailed(reason, self.last_error or "", self.failures)

    async def _build_spec(self) -> ChildSpec:
        return self._spec if isinstance(self._spec, ChildSpec) else await self._spec()

    async def _life(self) -> tuple[str, bool, bool]:
        """One child from spawn to exit: (why it ended, whether retrying is pointless, was it ready)."""
        try:
            spec = await self._build_spec()
        except ChildNotReady as exc:
            return str(exc), exc.permanent, False
        try:
            proc = await open_child_process(
                spec.argv,
                stdout=spec.stdout,
                stderr=subprocess.PIPE if spec.output is not None else subprocess.DEVNULL,
                pass_fds=tuple(s.fileno() for s in spec.handover),
            )
        except OSError as exc:
            self.last_error = f"cannot spawn {self.name}: {exc}"
            if spec.on_exit is not None:
                spec.on_exit()
            self._give_up(GiveUp.SPAWN)
        finally:
            for sock in spec.handover:
                sock.close()
        self._proc = proc
        log.info("event=child_spawned child=%r kind=%s pid=%d", self.name, spec.kind, proc.pid)
        error, permanent, was_ready = "", False, False
        try:
            if spec.pidfile is not None:
                write_pidfile(spec.pidfile, proc.pid, list(spec.argv), kind=spec.kind)
            async with trio.open_nursery() as nursery:
                if spec.output is not None:
                    assert proc.stderr is not None  # piped when there is an output
                    nursery.start_soon(spec.output.pump, proc.stderr)
                try:
                    value = await spec.ready(proc)
                except ChildNotReady as exc:
                    error, permanent = str(exc), exc.permanent
                else:
                    was_ready = True
                    self._became_ready(value)
                    error = await self._watch(spec, proc, value)
                nursery.cancel_scope.cancel()
        finally:
            await stop_process(proc, spec.grace_s)
            self._proc = None
            if spec.pidfile is not None:
                remove_pidfile(spec.pidfile)
            if spec.on_exit is not None:
                spec.on_exit()
        return error, permanent, was_ready

    def _became_ready(self, value: Any) -> None:
        self.ever_ready = True
        self.backoff.healthy(trio.current_time())
        if self.forgive_when_ready and self.crash_loop is not None:
            self.crash_loop.reset()
            self.failures = 0
        self._set(ChildState.READY)
        started = self._on_ready(value) if self._on_ready is not None else value
        if self._task_status is not None:
            self._task_status.started(started)
            self._task_status = None

    async def _watch(self, spec: ChildSpec, proc: trio.Process, value: Any) -> str:
        try:
            if spec.watch is not None:
                await spec.watch(proc, value)
            else:
                if proc.stdout is not None:
                    try:
                        while await proc.stdout.receive_some(_READ_CHUNK):
                            pass
                    except (trio.ClosedResourceError, trio.BrokenResourceError):
                        pass
                await proc.wait()
        except ChildExited as exc:
            return str(exc)
        with trio.move_on_after(spec.grace_s):
            await proc.wait()
        tail = spec.output.tail() if spec.output is not None else ""
        return f"{self.name} exited ({describe_returncode(proc.returncode)}){': ' + tail if tail else ''}"
