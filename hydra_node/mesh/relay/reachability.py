"""Can peers dial us? (sans-IO, time injected.) Dial-back reports in, a verdict out.

A node asks linked peers to dial back the addresses it advertises (``reach_dialback`` streams,
``link/dialback.py``); each report maps address → reached. The verdict:

* ``True`` — some peer reached us at some address (within ``REPORT_TTL_S``);
* ``False`` — ``required`` peers (2, or every peer asked when there are fewer) reached none;
* ``"unknown"`` — not asked yet, or too few answers.

``next_check(now)`` says when to ask again: soon while unknown, every ``UNREACHABLE_RECHECK_S`` while
unreachable, every ``RECHECK_S`` once reachable. (The relay agent also counts a direct inbound link
as proof that we can be dialled.)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping

__all__ = [
    "MAX_REPORTS",
    "RECHECK_S",
    "REPORT_TTL_S",
    "REQUIRED_REPORTS",
    "RETRY_S",
    "UNREACHABLE_RECHECK_S",
    "Reachability",
    "ReachabilityView",
]

MAX_REPORTS = 8
"""Latest report kept per checker, for this many checkers (oldest forgotten first)."""
REQUIRED_REPORTS = 2
"""Independent checkers that must fail to reach us before we call ourselves unreachable."""
REPORT_TTL_S = 900.0
"""A report older than this no longer counts (addresses and NAT mappings change)."""
RETRY_S = 2.0
"""Pause between checks while the verdict is unknown."""
RECHECK_S = 300.0
"""Pause between checks once we are known to be reachable."""
UNREACHABLE_RECHECK_S = 30.0
"""Pause between checks while we seem unreachable (dial-backs that timed out on a loaded host look the
same as a NAT: the verdict must not stick)."""


@dataclass(frozen=True)
class ReachabilityView:
    """``/api/status`` ``mesh.reachability``: the verdict and how it was learned."""

    reachable: bool | str
    method: str
    checked_by: int
    reached_by: int
    addresses: Mapping[str, bool]
    age_s: float | None


class Reachability:
    def __init__(self) -> None:
        self._reports: OrderedDict[str, tuple[float, dict[str, bool]]] = OrderedDict()
        self._addresses: tuple[str, ...] = ()
        self._last_check: float | None = None

    def set_addresses(self, addresses: tuple[str, ...]) -> None:
        """Our advertised addresses; a change forgets every report (they were about other addresses)."""
        if tuple(addresses) != self._addresses:
            self._addresses = tuple(addresses)
            self._reports.clear()
            self._last_check = None

    def report(self, checker: str, results: Mapping[str, bool], now: float) -> None:
        """``checker`` dialled our addresses: ``results`` maps each to whether it reached us."""
        mine = {a: bool(ok) for a, ok in results.items() if a in self._addresses}
        if not mine:
            return
        self._reports.pop(checker, None)
        self._reports[checker] = (now, mine)
        while len(self._reports) > MAX_REPORTS:
            self._reports.popitem(last=False)

    def checked(self, now: float) -> None:
        self._last_check = now

    def _live(self, now: float) -> list[dict[str, bool]]:
        return [r for t, r in self._reports.values() if now - t <= REPORT_TTL_S]

    def verdict(self, now: float, peers_available: int) -> bool | str:
        live = self._live(now)
        if any(any(r.values()) for r in live):
            return True
        required = max(1, min(REQUIRED_REPORTS, peers_available))
        return False if live and len(live) >= required else "unknown"

    def next_check(self, now: float, peers_available: int) -> float:
        if self._last_check is None:
            return now
        verdict = self.verdict(now, peers_available)
        pause = RETRY_S if verdict == "unknown" else RECHECK_S if verdict is True else UNREACHABLE_RECHECK_S
        return self._last_check + pause

    def view(self, now: float, peers_available: int) -> ReachabilityView:
        live = [(t, r) for t, r in self._reports.values() if now - t <= REPORT_TTL_S]
        merged: dict[str, bool] = {}
        for _, r in live:
            for a, ok in r.items():
                merged[a] = merged.get(a, False) or ok
        return ReachabilityView(
            reachable=self.verdict(now, peers_available),
            method="dialback",
            checked_by=len(live),
            reached_by=sum(1 for _, r in live if any(r.values())),
            addresses=merged,
            age_s=round(now - max(t for t, _ in live), 1) if live else None,
        )
