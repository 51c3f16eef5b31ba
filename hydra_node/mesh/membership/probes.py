"""Probes in flight: ours (at most one per target) and the PingReqs we serve for others."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["NACK_FRACTION", "Forward", "Probe", "ProbeTable"]

MAX_PROBE_ID = 2**63 - 1


@dataclass
class Probe:
    """Our probe of `target`: direct until `deadline`, then indirect through `helpers`."""

    target: str
    probe_id: int
    deadline: float
    indirect: bool = False
    helpers: tuple[str, ...] = ()
    nacks: set[str] = field(default_factory=set)  # helpers that answered "no ack from the target"
    sent_at: float = 0.0  # when the direct ping went out (for the round-trip estimate)


@dataclass
class Forward:
    """A ping we sent for `requester`'s PingReq; its Ack goes back under their probe id."""

    requester: str
    their_probe_id: int
    target: str
    deadline: float
    nack_at: float | None = None  # when to tell the requester we got no ack (None: told, or acked)


#: A helper nacks after this share of its indirect timeout, so the nack reaches the requester
#: before the requester's own (equal or longer, health-scaled) indirect timeout (memberlist: 80 %).
NACK_FRACTION = 0.8


class ProbeTable:
    def __init__(self, max_forwards: int) -> None:
        self.max_forwards = max_forwards
        self._probes: dict[int, Probe] = {}
        self._by_target: dict[str, int] = {}
        self._forwards: dict[int, Forward] = {}
        self._next_id = 1

    def new_id(self) -> int:
        pid = self._next_id
        self._next_id = pid + 1 if pid < MAX_PROBE_ID else 1
        return pid

    def start(self, target: str, deadline: float) -> Probe | None:
        """A new probe of `target`, or None if one is already running."""
        if target in self._by_target:
            return None
        probe = Probe(target, self.new_id(), deadline)
        self._probes[probe.probe_id] = probe
        self._by_target[target] = probe.probe_id
        return probe

    def get(self, probe_id: int) -> Probe | None:
        return self._probes.get(probe_id)

    def end(self, probe: Probe) -> None:
        self._probes.pop(probe.probe_id, None)
        if self._by_target.get(probe.target) == probe.probe_id:
            del self._by_target[probe.target]

    def end_target(self, target: str) -> None:
        if target in self._by_target:
            self.end(self._probes[self._by_target[target]])

    def clear(self) -> None:
        self._probes.clear()
        self._by_target.clear()
        self._forwards.clear()

    def due(self, now: float) -> list[Probe]:
        return [p for p in self._probes.values() if p.deadline <= now]

    def add_forward(
        self, requester: str, their_probe_id: int, target: str, deadline: float, nack_at: float | None = None
    ) -> int | None:
        """Our probe id for the forwarded ping, or None when `max_forwards` are in flight."""
        if len(self._forwards) >= self.max_forwards:
            return None
        pid = self.new_id()
        self._forwards[pid] = Forward(requester, their_probe_id, target, deadline, nack_at)
        return pid

    def due_nacks(self, now: float) -> list[Forward]:
        """Forwards whose target has not acked by their nack time (each returned once)."""
        due = [f for f in self._forwards.values() if f.nack_at is not None and f.nack_at <= now]
        for f in due:
            f.nack_at = None
        return due

    def pop_forward(self, probe_id: int, sender: str, subject: str) -> Forward | None:
        """The forward this Ack answers (from its target, about its target), removed."""
        fwd = self._forwards.get(probe_id)
        if fwd is None or sender != fwd.target or subject != fwd.target:
            return None
        return self._forwards.pop(probe_id)

    def expire_forwards(self, now: float) -> None:
        for pid in [pid for pid, f in self._forwards.items() if f.deadline <= now]:
            del self._forwards[pid]

    def deadlines(self) -> Iterator[float]:
        yield from (p.deadline for p in self._probes.values())
        yield from (f.deadline for f in self._forwards.values())
        yield from (f.nack_at for f in self._forwards.values() if f.nack_at is not None)
