"""Helpers that run inside the node's child processes (model runners, draft servers)."""

from __future__ import annotations

import os
import threading
import time


def die_with_parent(poll_s: float = 0.5) -> None:
    """Exit when the node process goes away: a back-up for children not started by the node.

    Children the node starts already carry ``PR_SET_PDEATHSIG = SIGKILL``, set before exec
    and bound to the node's long-lived spawner thread (:mod:`hydra_node.runtime._spawn`).
    That signal follows the *thread* that forked, so a child started some other way (e.g.
    from one of trio's cached worker threads, which exit when idle) cannot rely on it; this
    daemon thread polls the parent pid instead and works whoever forked.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class TokenClock:
    """Time to first token and mean inter-token latency of one generation (monotonic clock)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.first: float | None = None
        self.last: float | None = None
        self.gaps = 0.0

    def tick(self) -> None:
        """A token came out of the model."""
        now = time.monotonic()
        if self.first is None or self.last is None:  # (set together: the first token)
            self.first = now
        else:
            self.gaps += now - self.last
        self.last = now

    def ttft_ms(self) -> float:
        return ((self.first or time.monotonic()) - self.start) * 1000

    def itl_ms(self, tokens: int) -> float:
        return self.gaps / (tokens - 1) * 1000 if tokens > 1 else 0.0
