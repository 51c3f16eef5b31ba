"""When to try moving a relayed link to a direct path, and when to stop (sans-IO, time injected).

One :class:`UpgradePlan` per relayed link, on the end that drives the upgrade. Attempts come in
rounds: ``ATTEMPTS_PER_ROUND`` attempts ``ATTEMPT_GAP_S`` apart (libp2p's DCUtR makes 3), then, if
all failed, the next round after the node's one back-off policy (``backoff.Backoff``: 10 s, 30 s,
90 s, ... jittered), at most ``MAX_ROUNDS`` rounds; then the link stays relayed for good. A peer's
refusal that will not change (it does not punch, or knows no public address) ends the plan at
once. The legal moves are one table (:data:`TRANSITIONS`); anything else raises
:class:`UpgradeStateError` naming the state.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra_node.backoff import Backoff
from hydra_node.statemachine import InvalidTransition, StateTable

__all__ = [
    "ATTEMPTS_PER_ROUND",
    "ATTEMPT_GAP_S",
    "FINAL_REFUSALS",
    "MAX_ROUNDS",
    "ROUND_BACKOFF",
    "TRANSITIONS",
    "UPGRADE_MACHINE",
    "UpgradePlan",
    "UpgradeStateError",
    "UpgradeStatus",
]

ATTEMPTS_PER_ROUND = 3
"""Attempts in one round (DCUtR's number): a SYN lost to timing is retried at once."""
ATTEMPT_GAP_S = 1.0
"""Pause between two attempts of a round."""
MAX_ROUNDS = 5
"""Rounds before giving up: the NAT in the way is then taken to be one that punching cannot pass
(symmetric, or not port-preserving), and the link stays relayed."""
ROUND_BACKOFF = Backoff(initial_s=10.0, factor=3.0, max_s=900.0, jitter=0.2, reset_after_s=0.0)
"""Pause between rounds: 10 s, 30 s, 90 s, 270 s (each +-20 %)."""
FINAL_REFUSALS = frozenset({"disabled", "no_address", "not_relayed", "bad_punch"})
"""Refusal codes that another attempt would get again: the plan ends at the first."""

WAITING, ATTEMPTING, DIRECT, GAVE_UP = "waiting", "attempting", "direct", "gave_up"

#: state -> {event: next state}. A failed attempt is ``failed`` while attempts or rounds are left,
#: ``exhausted`` when it was the last one; DIRECT and GAVE_UP take nothing.
TRANSITIONS: dict[str, dict[str, str]] = {
    WAITING: {"begin": ATTEMPTING, "abandon": GAVE_UP},
    ATTEMPTING: {"failed": WAITING, "exhausted": GAVE_UP, "refused": GAVE_UP, "succeeded": DIRECT, "abandon": GAVE_UP},
}
UPGRADE_MACHINE = StateTable("upgrade plan", TRANSITIONS)


class UpgradeStateError(Exception):
    """A move the table does not allow (our bug, never the peer's)."""


@dataclass(frozen=True)
class UpgradeStatus:
    state: str
    round: int
    attempt: int
    attempts_made: int
    last_reason: str | None
    next_at: float | None


class UpgradePlan:
    """Where one link's upgrade stands. ``begin``/``failed``/``refused``/``succeeded``/``abandon``
    move it; ``due(now)`` says whether an attempt should start now."""

    def __init__(
        self,
        now: float,
        *,
        attempts_per_round: int = ATTEMPTS_PER_ROUND,
        max_rounds: int = MAX_ROUNDS,
        backoff: Backoff = ROUND_BACKOFF,
    ) -> None:
        if attempts_per_round < 1 or max_rounds < 1:
            raise ValueError("an upgrade plan needs at least one attempt and one round")
        self.state = WAITING
        self.round = 0  # 0-based
        self.attempt = 0  # attempts made in this round
        self.attempts_made = 0
        self.last_reason: str | None = None
        self.next_at = now  # the first attempt is due at once
        self._per_round, self._max_rounds, self._backoff = attempts_per_round, max_rounds, backoff

    @property
    def finished(self) -> bool:
        return self.state in (DIRECT, GAVE_UP)

    def due(self, now: float) -> bool:
        return self.state == WAITING and now >= self.next_at

    def _move(self, event: str) -> None:
        try:
            self.state = UPGRADE_MACHINE.next(self.state, event)
        except InvalidTransition as exc:
            raise UpgradeStateError(f"upgrade plan in state {self.state!r} cannot take {event!r}") from exc

    def begin(self, now: float) -> None:
        if now < self.next_at:
            raise UpgradeStateError(f"upgrade attempt started {self.next_at - now:.3f} s early")
        self._move("begin")
        self.attempt += 1
        self.attempts_made += 1

    def failed(self, now: float, reason: str, u: float) -> None:
        """The attempt failed (``u`` uniform in [0, 1) for the round back-off's jitter)."""
        self.last_reason = reason
        if self.attempt < self._per_round:
            self._move("failed")
            self.next_at = now + ATTEMPT_GAP_S
        elif self.round + 1 < self._max_rounds:
            self._move("failed")
            self.next_at = now + self._backoff.delay(self.round, u)
            self.round += 1
            self.attempt = 0
        else:
            self._move("exhausted")

    def refused(self, now: float, code: str, u: float) -> None:
        """The peer refused with ``code``: final ones end the plan, others count as a failure."""
        if code in FINAL_REFUSALS:
            self.last_reason = f"refused:{code}"
            self._move("refused")
        else:
            self.failed(now, f"refused:{code}", u)

    def succeeded(self) -> None:
        self.last_reason = None
        self._move("succeeded")

    def abandon(self, reason: str) -> None:
        """Stop for good (nothing to punch with: no public address known, punching off)."""
        self.last_reason = reason
        self._move("abandon")

    def status(self) -> UpgradeStatus:
        return UpgradeStatus(
            state=self.state,
            round=self.round,
            attempt=self.attempt,
            attempts_made=self.attempts_made,
            last_reason=self.last_reason,
            next_at=self.next_at if self.state == WAITING else None,
        )
