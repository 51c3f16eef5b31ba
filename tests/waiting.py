"""Bounded waits for tests: wait for a condition instead of sleeping and hoping.

`wait_until` is for trio tests. It has no timeout of its own: the caller owns the bound, as a
cancel scope (`with trio.fail_after(...)`), which counts virtual seconds under the
`autojump_clock` fixture, so polling there costs no real time.

`poll_until` is its blocking twin for code that drives real processes from plain threads
(`harness.py`, `netlab.py`): the only place a test still sleeps on the real clock, always
with a deadline and always ending in a `TimeoutError` that says what was awaited.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

import trio

__all__ = ["AUTOJUMP_IDLE_S", "TRIO_POLL_S", "poll_until", "wait_until"]

T = TypeVar("T")

#: Real seconds a trio run must sit idle before the tests' mock clock jumps to the next deadline
#: (the ``autojump_clock`` fixture in conftest.py says why it is not 0).
AUTOJUMP_IDLE_S = 0.02
#: Poll interval inside trio: short, as polling in-process state is cheap (and free in virtual time).
TRIO_POLL_S = 0.01


async def wait_until(predicate: Callable[[], T], *, interval_s: float = TRIO_POLL_S) -> T:
    """Return the first truthy value of ``predicate()``, checking every ``interval_s``.

    Bound it by the caller's cancel scope (``with trio.fail_after(...)``)."""
    while not (value := predicate()):
        await trio.sleep(interval_s)
    return value


def poll_until(predicate: Callable[[], T], *, timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """Blocking: the first truthy value of ``predicate()`` within ``timeout_s`` real seconds.

    Exceptions from ``predicate`` propagate (a dead process should fail the wait at once);
    running out of time raises ``TimeoutError`` naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{what} not reached within {timeout_s} s")
        time.sleep(min(interval_s, remaining))
