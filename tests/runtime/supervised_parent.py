"""A parent process for test_supervise: supervises one sleeping child and prints its pid.

    python supervised_parent.py RUN_DIR

Once trio has no worker thread left (they exit after IDLE_TIMEOUT_S idle seconds; a thread that
forked a child with PR_SET_PDEATHSIG kills it as it exits) it prints ``idle``. The test then checks
the child is still alive, kill -9's this process and checks that the child goes with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import trio
import trio._core._thread_cache as trio_thread_cache

from hydra_node.runtime.supervise import ChildNotReady, ChildSpec, ChildSupervisor

CHILD = "import time; print('ready', flush=True); time.sleep(300)"
#: trio names its cached worker threads "Trio thread N".
TRIO_THREAD = "Trio thread"
#: Idle seconds before a cached trio thread exits: trio's 10 s, shortened here so the test need not
#: wait them out (a private trio setting, read each time a thread starts idling; checked below).
IDLE_TIMEOUT_S = 0.5


async def read_ready(proc: trio.Process) -> int:
    buf = b""
    while b"\n" not in buf:
        chunk = await proc.stdout.receive_some(1024)
        if not chunk:
            raise ChildNotReady("exited before ready")
        buf += chunk
    return proc.pid


async def main(run_dir: Path) -> None:
    spec = ChildSpec(
        [sys.executable, "-c", CHILD],
        ready=read_ready,
        kind="sleeper",
        stdout=subprocess.PIPE,
        pidfile=run_dir / "sleeper.pid",
    )
    sup = ChildSupervisor("sleeper", spec)
    async with trio.open_nursery() as nursery:
        pid = await nursery.start(sup.run)
        print(pid, flush=True)
        while not trio_threads_gone():
            await trio.sleep(0.05)
        print("idle", flush=True)


def trio_threads_gone() -> bool:
    """No trio worker thread left, in Python's view and in the kernel's (every OS thread is one
    Python knows, so none is still exiting)."""
    return (
        not any(t.name.startswith(TRIO_THREAD) for t in threading.enumerate())
        and len(os.listdir("/proc/self/task")) == threading.active_count()
    )


if __name__ == "__main__":
    assert isinstance(trio_thread_cache.IDLE_TIMEOUT, (int, float)), "trio's thread cache changed"
    trio_thread_cache.IDLE_TIMEOUT = IDLE_TIMEOUT_S
    trio.run(main, Path(sys.argv[1]))
