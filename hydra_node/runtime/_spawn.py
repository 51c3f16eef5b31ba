"""Starting and stopping child processes that die with the node.

Every child is started with ``PR_SET_PDEATHSIG = SIGKILL``, set by ``prctl`` in the child
between fork and exec, so a ``kill -9`` of the node takes its children with it.

Linux sends that signal when the *thread* that forked the child exits, not the process.
``trio.lowlevel.open_process`` forks from a worker of trio's thread cache, and those exit
after ten idle seconds: a child spawned there would be killed ten seconds later.  So here
children are forked from one spawner thread that lives as long as the node process, and
the resulting ``subprocess.Popen`` is wrapped in a :class:`trio.Process` exactly as
``open_process`` does it (pipes made the same way; ``Process._create`` is the constructor
``open_process`` itself uses; trio is pinned in ``pyproject.toml``).

Stopping follows ``trio.run_process``: terminate, a grace period, kill, always wait; and
only ever through the process object (it knows when the pid has been reaped), never with
``os.kill`` on a stored pid.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from functools import partial

import trio

__all__ = ["open_child_process", "stop_process", "describe_returncode"]

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: the child only calls into it


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """The ``preexec_fn``: runs in the child after fork, before exec."""

    def preexec() -> None:
        if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent_pid:  # the node died before prctl took effect
            os._exit(126)

    return preexec


class _Spawner:
    """One daemon thread, started on first use and never ended, that forks every child."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], subprocess.Popen]) -> concurrent.futures.Future:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="hydra-child-spawner", daemon=True)
                self._thread.start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future

    def _serve(self) -> None:
        while True:
            fn, future = self._jobs.get()
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the awaiting task, which re-raises it
                future.set_exception(exc)


_spawner = _Spawner()


def _pipe_from_child() -> tuple[trio.lowlevel.FdStream, int]:
    rfd, wfd = os.pipe()
    return trio.lowlevel.FdStream(rfd), wfd


async def open_child_process(
    argv: Sequence[str],
    *,
    stdout: int | None = subprocess.DEVNULL,
    stderr: int | None = subprocess.DEVNULL,
    pass_fds: Sequence[int] = (),
) -> trio.Process:
    """Like ``trio.lowlevel.open_process`` (stdin is /dev/null), but the child dies with us.

    ``stdout``/``stderr``: ``subprocess.PIPE`` (a trio stream on the process object),
    ``subprocess.DEVNULL`` or a file descriptor.
    Raises ``OSError`` when the program cannot be started.
    """
    out_stream = err_stream = None
    child_ends: list[int] = []
    try:
        if stdout == subprocess.PIPE:
            out_stream, stdout = _pipe_from_child()
            child_ends.append(stdout)
        if stderr == subprocess.PIPE:
            err_stream, stderr = _pipe_from_child()
            child_ends.append(stderr)
        popen_call = partial(
            subprocess.Popen,
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            pass_fds=tuple(pass_fds),
            preexec_fn=_die_with_parent(os.getpid()),
        )
        future = _spawner.submit(popen_call)
        with trio.CancelScope(shield=True):  # bounded by fork + exec; the Popen must not be lost
            popen = await trio.to_thread.run_sync(future.result)
    except BaseException:
        for stream in (out_stream, err_stream):
            if stream is not None:
                await stream.aclose()
        raise
    finally:
        for fd in child_ends:
            os.close(fd)
    return trio.Process._create(popen, None, out_stream, err_stream)


def describe_returncode(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


async def stop_process(proc: trio.Process, grace_s: float) -> None:
    """Terminate, wait ``grace_s``, kill, always wait; then close its pipes.  Shielded:
    this is the bounded clean-up every exit path runs, cancellation included."""
    with trio.CancelScope(shield=True):
        if proc.returncode is None:
            proc.terminate()
            with trio.move_on_after(grace_s):
                await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                await stream.aclose()
