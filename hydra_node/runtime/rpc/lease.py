"""Who may drive a worker: one coordinator at a time (pure bookkeeping).

A ggml RPC server serves one client connection at a time; a second coordinator
would block inside llama.cpp's handshake.  The node that owns a worker therefore
hands out a lease before it opens a tunnel to it.  Time is injected: with a ``ttl_s``
a lease not renewed by ``now + ttl_s`` may be taken over (its coordinator vanished).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LeaseError", "LeaseHeld", "LeaseNotHeld", "LeaseRow", "WorkerLease"]


class LeaseError(Exception):
    """Base class for lease refusals (the asking coordinator's fault)."""


class LeaseHeld(LeaseError):
    def __init__(self, worker_id: str, holder: str, requester: str):
        super().__init__(
            f"RPC worker {worker_id!r} is leased to coordinator {holder!r}; "
            f"{requester!r} must wait or pick another worker"
        )
        self.worker_id, self.holder, self.requester = worker_id, holder, requester


class LeaseNotHeld(LeaseError):
    def __init__(self, worker_id: str, holder: str | None, requester: str):
        super().__init__(
            f"coordinator {requester!r} does not hold the lease on RPC worker {worker_id!r} (holder: {holder!r})"
        )
        self.worker_id, self.holder, self.requester = worker_id, holder, requester


@dataclass(frozen=True)
class LeaseRow:
    """A lease as ``/api/status`` ``rpc_worker.leases`` shows it: the coordinator's node id, the model
    it leases for (the lease tag), since when (the ``now`` it was granted at), the bytes tunnelled."""

    coordinator: str
    model: str | None
    since: float | None
    bytes_in: int = 0
    bytes_out: int = 0


@dataclass
class WorkerLease:
    worker_id: str
    ttl_s: float | None = None
    _holder: str | None = None
    _expires: float | None = None
    _since: float | None = None

    def row(self, now: float = 0.0, *, bytes_in: int = 0, bytes_out: int = 0) -> LeaseRow | None:
        """The current lease for status (None when free); a holder ``node/tag`` is split into both."""
        holder = self.holder(now)
        if holder is None:
            return None
        coordinator, _, tag = holder.partition("/")
        return LeaseRow(coordinator, tag or None, self._since, bytes_in, bytes_out)

    def holder(self, now: float = 0.0) -> str | None:
        """The coordinator holding the lease at ``now`` (None when free or expired)."""
        if self._holder is not None and self._expires is not None and now >= self._expires:
            return None
        return self._holder

    def acquire(self, coordinator_id: str, *, now: float = 0.0) -> None:
        """Take (or renew) the lease; :class:`LeaseHeld` if another coordinator has it."""
        if not coordinator_id:
            raise ValueError("coordinator_id must be non-empty")
        current = self.holder(now)
        if current is not None and current != coordinator_id:
            raise LeaseHeld(self.worker_id, current, coordinator_id)
        if current != coordinator_id:
            self._since = now
        self._holder = coordinator_id
        self._expires = None if self.ttl_s is None else now + self.ttl_s

    def release(self, coordinator_id: str, *, now: float = 0.0) -> None:
        """Give the lease back; :class:`LeaseNotHeld` unless ``coordinator_id`` holds it."""
        current = self.holder(now)
        if current != coordinator_id:
            raise LeaseNotHeld(self.worker_id, current, coordinator_id)
        self._holder = self._expires = self._since = None

    def revoke(self) -> str | None:
        """Void the lease (the worker restarted: its coordinator's state there is gone)."""
        previous, self._holder, self._expires, self._since = self._holder, None, None, None
        return previous
