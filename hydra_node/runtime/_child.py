"""Helpers for child processes the node supervises (model runners, draft servers)."""

from __future__ import annotations

import os
import threading
import time


def die_with_parent(poll_s: float = 0.5) -> None:
    """Exit when the node process goes away.

    PR_SET_PDEATHSIG fires when the *spawning thread* exits, and trio spawns from a
    worker thread, so a daemon thread polls the parent pid instead.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
