"""A parent process for test_supervise: supervises one sleeping child and prints its pid.

    python supervised_parent.py RUN_DIR

The test kill -9's this process and checks that the child goes with it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import trio

from hydra_node.runtime.supervise import ChildNotReady, ChildSpec, ChildSupervisor

CHILD = "import time; print('ready', flush=True); time.sleep(300)"


async def read_ready(proc: trio.Process) -> int:
    buf = b""
    while b"\n" not in buf:
        chunk = await proc.stdout.receive_some(1024)
        if not chunk:
            raise ChildNotReady("exited before ready")
        buf += chunk
    return proc.pid


async def main(run_dir: Path) -> None:
    spec = ChildSpec([sys.executable, "-c", CHILD], ready=read_ready, kind="sleeper", stdout=subprocess.PIPE,
                     pidfile=run_dir / "sleeper.pid")
    sup = ChildSupervisor("sleeper", spec)
    async with trio.open_nursery() as nursery:
        pid = await nursery.start(sup.run)
        print(pid, flush=True)


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]))
