"""Pid files with metadata, and clean-up of stale ones and of orphaned children.

A pid file is JSON: ``{"pid", "start_time", "argv", "owner_pid", "owner_start_time",
"kind"}``.  ``start_time`` is the process start time read from ``/proc`` (clock
ticks since boot), so a recycled pid is never mistaken for our process.

Every child the node supervises (kinds ``runner``, ``rpc-worker``, ``draft-server``)
has one in ``<home>/run`` while it runs (:mod:`hydra_node.runtime.supervise`).  Children
die with the node (``PR_SET_PDEATHSIG``); :func:`reap_stale` at the next start removes
the files they leave behind and kills any child that still outlived its owner.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    return data[data.rfind(b")") + 2 :].split()


def _start_time(rest: list[bytes] | None) -> int | None:
    """The start time field of parsed ``/proc/<pid>/stat`` fields, or None."""
    try:
        return int(rest[19]) if rest is not None else None
    except (IndexError, ValueError):
        return None


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it does not exist."""
    return _start_time(_stat(pid))


def is_same_process(pid: int, start_time: int | None) -> bool:
    """``pid`` runs and is the process that started at ``start_time`` (any, if None).

    A zombie does not run: an orphan killed with its owner may stay one where nothing
    reaps reparented children (containers without an init).
    """
    rest = _stat(pid)
    if rest is None or rest[:1] in ([b"Z"], [b"X"]):
        return False
    st = _start_time(rest)
    return st is not None and (start_time is None or st == start_time)


@dataclass(frozen=True)
class PidRecord:
    pid: int
    start_time: int | None
    argv: list
    owner_pid: int
    owner_start_time: int | None
    kind: str
    created_at: float

    def alive(self) -> bool:
        """The recorded process still runs. A record without a start time proves nothing about
        whoever has that pid now, so it is never alive (and never signalled)."""
        return self.start_time is not None and is_same_process(self.pid, self.start_time)

    def owner_alive(self) -> bool:
        return is_same_process(self.owner_pid, self.owner_start_time)


def write_pidfile(path: Path, pid: int, argv: list, kind: str, owner_pid: int | None = None) -> PidRecord:
    owner = owner_pid if owner_pid is not None else os.getpid()
    rec = PidRecord(
        pid, process_start_time(pid), [str(a) for a in argv][:16], owner, process_start_time(owner), kind, time.time()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(rec)))
    os.replace(tmp, path)
    return rec


def read_pidfile(path: Path) -> PidRecord | None:
    try:
        d = json.loads(path.read_text())
        return PidRecord(
            int(d["pid"]),
            d.get("start_time"),
            list(d.get("argv", [])),
            int(d["owner_pid"]),
            d.get("owner_start_time"),
            str(d.get("kind", "")),
            float(d.get("created_at", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_pidfile(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def reap_stale(run_dir: Path, log=None) -> list[str]:
    """Remove pid files whose process is gone; kill children whose owner is gone.

    Returns a description of each action, for the log.
    """
    actions: list[str] = []
    if not run_dir.is_dir():
        return actions
    for path in sorted(run_dir.glob("*.pid")):
        rec = read_pidfile(path)
        if rec is None:
            remove_pidfile(path)
            actions.append(f"removed unreadable pid file {path.name}")
            continue
        if not rec.alive():
            remove_pidfile(path)
            actions.append(f"removed stale pid file {path.name} (pid {rec.pid} gone)")
        elif rec.kind != "node" and not rec.owner_alive():
            killed = kill_recorded(rec)
            remove_pidfile(path)
            actions.append(
                f"killed orphaned {rec.kind} pid {rec.pid} (owner {rec.owner_pid} gone)"
                if killed
                else f"removed stale pid file {path.name} (pid {rec.pid} gone)"
            )
    return actions


def kill_recorded(rec: PidRecord) -> bool:
    """SIGKILL the process ``rec`` describes, if it still is that process (:func:`signal_recorded`)."""
    return signal_recorded(rec, signal.SIGKILL)


def signal_recorded(rec: PidRecord, sig: int) -> bool:
    """Send ``sig`` to the process ``rec`` describes, if it still is that process.

    The pid is pinned with a pidfd first and its start time checked after, so a pid the
    kernel recycled in between is never signalled; nor is any pid of a record without a start
    time.  False if it was already gone.
    """
    try:
        fd = os.pidfd_open(rec.pid)
    except ProcessLookupError:
        return False
    try:
        if not rec.alive():
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


class NodeAlreadyRunning(Exception):
    """Another live node holds this home's pidfile."""
