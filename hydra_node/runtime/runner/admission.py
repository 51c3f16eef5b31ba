"""How many generations the node lets into one runner child at once (a resizable, FIFO-fair limit).

The runner batches up to ``parallel`` sequences; the child says in its ``ready`` frame how
many it really runs (1 with a draft model), so the limit changes after every (re)start.
Waiters are served strictly in arrival order (a trio ``ParkingLot``), so the bounded queue
in front of the runner stays first come, first served.
"""

from __future__ import annotations

import trio

__all__ = ["AdmissionLimit"]


class AdmissionLimit:
    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self.used = 0
        self._lot = trio.lowlevel.ParkingLot()

    async def acquire(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.used < self.capacity and not self._lot:
            self.used += 1
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        await self._lot.park()  # whoever unparks us has already counted us in `used`

    def release(self) -> None:
        if self.used <= 0:
            raise RuntimeError("AdmissionLimit released more often than acquired")
        self.used -= 1
        self._wake()

    def resize(self, capacity: int) -> None:
        """A smaller capacity takes effect as running generations finish; none is cut short."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self._wake()

    def _wake(self) -> None:
        while self.used < self.capacity and self._lot:
            self._lot.unpark(count=1)
            self.used += 1
