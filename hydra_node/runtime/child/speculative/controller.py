"""Adaptive draft length: a pure policy over measured acceptance and costs.

Nothing here reads the clock: callers pass durations they measured.  The model is
Leviathan et al.'s, extended with a batched verify cost and a round-trip time::

    E(k)  = (1 - a^(k+1)) / (1 - a)                  expected tokens per round
    S(k)  = E(k) * t_target / (k * t_draft + t_verify(k) + rtt)
    t_verify(k) = measured EWMA for this k, else a line through measured points (batch of k + 1)

``choose_k`` returns the k in [draft_min_tokens, draft_max_tokens] maximising S, or 0
(plain target decoding) when speculation does not pay; after ``reprobe_after_tokens``
plain tokens it proposes one probe round so speculation can come back.

"Does not pay" is decided on MEASURED rates, not only on the model: ``recent_speedup`` is the
plain step time (an EWMA of the k = 0 steps, refreshed by a plain step every
``refresh_target_every_rounds`` rounds while speculating) over the EWMA of seconds per token of
the speculative rounds (draft + verify + round trip, divided by the tokens each round emitted).
Below ``min_speedup`` (after ``min_rounds_before_fallback`` rounds) speculation stops; it comes
back after a probe only when both the measured and the predicted speedup reach
``resume_speedup`` (hysteresis).  The predicted S(k) still chooses k, and still stops a pair
that could not pay even with every draft token accepted.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class ControllerConfig:
    draft_min_tokens: int = 1
    draft_max_tokens: int = 8
    #: Acceptance assumed before any round was observed.
    alpha_prior: float = 0.7
    #: EWMA weight of one observed token's acceptance (about a 20-token memory); the first
    #: observations are averaged with the prior counted as ``alpha_prior_tokens`` tokens.
    alpha_weight: float = 0.05
    alpha_prior_tokens: int = 2
    #: EWMA weight of one timing sample.
    cost_weight: float = 0.2
    #: Plain target tokens between probe rounds while speculation is off (doubles per failed
    #: probe, up to ``reprobe_max_tokens``).
    reprobe_after_tokens: int = 32
    reprobe_max_tokens: int = 1024
    #: Verify cost per draft token, as a fraction of a target step, before any round was seen.
    verify_slope_prior: float = 0.35
    #: While speculating, one plain target step every this many rounds keeps t_target fresh.
    refresh_target_every_rounds: int = 32
    #: Fall back to plain decoding below this predicted speedup (once the first
    #: ``min_rounds_before_fallback`` rounds gave alpha some evidence); resume speculating after
    #: a probe only above ``resume_speedup`` (hysteresis against flapping on noisy timings).
    min_speedup: float = 1.0
    min_rounds_before_fallback: int = 4
    resume_speedup: float = 1.05
    #: Also fall back (same evidence rule) while the measured acceptance is below this.
    min_acceptance: float = 0.0
    #: Rounds per probe while speculation is off.  The first round of a probe mostly pays the
    #: draft's catch-up on the plain tokens (not representative); the resume decision is taken on
    #: the probe's representative rounds only.
    probe_rounds: int = 2
    #: While the pair is hopeless (even full acceptance could not pay, by the measured costs), probe
    #: only after this many plain tokens: a probe of such a pair is a sure loss.
    hopeless_reprobe_tokens: int = 4096
    #: The measured rule compares MEDIANS of this many recent plain steps and recent speculative
    #: rounds (per emitted token): one step stalled by another process must not flip the decision.
    recent_window: int = 9

    def __post_init__(self) -> None:
        if not 1 <= self.draft_min_tokens <= self.draft_max_tokens:
            raise ValueError("need 1 <= draft_min_tokens <= draft_max_tokens")
        if not 0.0 < self.alpha_weight <= 1.0 or not 0.0 < self.cost_weight <= 1.0:
            raise ValueError("EWMA weights must be in (0, 1]")
        if not 0.0 <= self.min_acceptance <= 1.0:
            raise ValueError("min_acceptance must be in [0, 1]")
        if not 0.0 <= self.alpha_prior <= 1.0:
            raise ValueError("alpha_prior must be in [0, 1]")
        if self.resume_speedup < self.min_speedup:
            raise ValueError("resume_speedup must be >= min_speedup")
        if self.recent_window < 1:
            raise ValueError("recent_window must be at least 1")
        if self.probe_rounds < 1:
            raise ValueError("probe_rounds must be at least 1")
        if self.reprobe_after_tokens < 1 or self.reprobe_max_tokens < self.reprobe_after_tokens:
            raise ValueError("need 1 <= reprobe_after_tokens <= reprobe_max_tokens")


@dataclass(frozen=True)
class SpeculationStats:
    """What the console shows about speculation on one model pair."""

    acceptance_rate: float
    tokens_per_round: float
    k: int
    predicted_speedup: float
    measured_speedup: float
    rounds: int
    draft_tokens: int
    accepted_tokens: int
    target_only_tokens: int
    speculating: bool


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens emitted by a round of ``k`` draft tokens (Leviathan Eq. 1)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def leviathan_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan Thm 3.8: E(k) / (k c + 1), verify assumed to cost one target step."""
    return expected_tokens(alpha, k) / (k * c + 1.0)


class SpeculationController:
    """Chooses the draft length per round from what earlier rounds measured."""

    def __init__(self, config: ControllerConfig | None = None) -> None:
        self.config = config or ControllerConfig()
        self.alpha = self.config.alpha_prior
        self.t_target: float | None = None  # one plain target step (batch of 1)
        self.t_draft: float | None = None  # one draft token
        self._alpha_seen = 0
        self._verify: dict[int, float] = {}  # k -> EWMA of verify seconds (k <= draft_max_tokens)
        self.rtt = 0.0
        self._speculating = True
        self._plain_since_probe = 0
        self._reprobe_every = self.config.reprobe_after_tokens
        self._last_k = 0
        self._rounds = 0
        self._drafted = 0
        self._accepted = 0
        self._spec_tokens = 0
        self._spec_seconds = 0.0
        self._plain_tokens = 0
        self._rounds_since_plain = 0
        self._rounds_on = 0  # rounds since speculation (re)started: evidence for the measured rule
        self._plain_recent: deque[float] = deque(maxlen=self.config.recent_window)  # plain step seconds
        self._spec_recent: deque[float] = deque(maxlen=self.config.recent_window)  # round seconds per token
        self._probe_left = 0  # rounds of the current probe still to run (speculation off)
        self._probe = [0, 0.0]  # tokens and seconds of the probe's representative rounds

    # -- the policy -------------------------------------------------------------------
    def t_verify(self, k: int) -> float:
        """Predicted seconds to verify k draft tokens: the measured EWMA for k, else a line
        through the two nearest measured k (or through (0, t_target) and the one measured k)."""
        if k in self._verify:
            return self._verify[k]
        if self.t_target is None:
            return 0.0
        if not self._verify:
            return self.t_target * (1.0 + self.config.verify_slope_prior * k)
        points = sorted(self._verify.items(), key=lambda kv: (abs(kv[0] - k), kv[0]))[:2]
        if len(points) == 1:
            points.append((0, self.t_target))
        (k1, t1), (k2, t2) = points
        slope = max(0.0, (t2 - t1) / (k2 - k1))
        return max(self.t_target, t1 + slope * (k - k1))

    def predicted_speedup(self, k: int, alpha: float | None = None) -> float:
        """S(k) at the current alpha (or at the given one)."""
        if k == 0 or self.t_target is None or self.t_draft is None:
            return 1.0
        cost = k * self.t_draft + self.t_verify(k) + self.rtt
        return expected_tokens(self.alpha if alpha is None else alpha, k) * self.t_target / cost

    @property
    def t_plain_recent(self) -> float | None:
        return statistics.median(self._plain_recent) if self._plain_recent else None

    @property
    def t_spec_token(self) -> float | None:
        """Median seconds per emitted token of the recent speculative rounds (None: none yet)."""
        return statistics.median(self._spec_recent) if self._spec_recent else None

    def recent_speedup(self) -> float | None:
        """Measured: plain seconds per token / speculative seconds per token (medians of the recent
        steps and rounds); None until both were measured."""
        plain, spec = self.t_plain_recent, self.t_spec_token
        if not plain or not spec:
            return None
        return plain / spec

    def _measured_poor(self, threshold: float) -> bool:
        r = self.recent_speedup()
        return r is not None and r < threshold

    def best_k(self) -> tuple[int, float]:
        c = self.config
        return max(
            ((k, self.predicted_speedup(k)) for k in range(c.draft_min_tokens, c.draft_max_tokens + 1)),
            key=lambda ks: ks[1],
        )

    def choose_k(self) -> int:
        """Draft length for the next round; 0 means one plain target step."""
        c = self.config
        if self.t_target is None:
            k = 0  # measure a plain step first
        elif self.t_draft is None:
            k = min(max(4, c.draft_min_tokens), c.draft_max_tokens)  # first round: measure the draft
        else:
            k, s = self.best_k()
            hopeless = (
                max(self.predicted_speedup(j, 1.0) for j in range(c.draft_min_tokens, c.draft_max_tokens + 1))
                < c.min_speedup
            )  # even if every draft token were accepted
            poor = s < c.min_speedup or self.alpha < c.min_acceptance or self._measured_poor(c.min_speedup)
            if self._speculating and poor and (self._rounds_on >= c.min_rounds_before_fallback or hopeless):
                self._speculating = False
                self._plain_since_probe = 0
            if self._speculating and self._rounds_since_plain >= c.refresh_target_every_rounds:
                k = 0
            elif not self._speculating:
                due = c.hopeless_reprobe_tokens if hopeless else self._reprobe_every
                if self._probe_left == 0 and self._plain_since_probe >= due:
                    self._plain_since_probe = 0
                    self._reprobe_every = min(self._reprobe_every * 2, c.reprobe_max_tokens)
                    self._probe_left, self._probe = c.probe_rounds, [0, 0.0]
                if self._probe_left == 0:
                    k = 0
        self._last_k = k
        return k

    # -- measurements -----------------------------------------------------------------
    def record_target_step(self, seconds: float) -> None:
        """A plain target step (one token, no draft) took ``seconds``."""
        self.t_target = self._ewma(self.t_target, seconds)
        self._plain_recent.append(max(0.0, float(seconds)))
        self._plain_tokens += 1
        self._plain_since_probe += 1
        self._rounds_since_plain = 0

    def record_round(
        self,
        k: int,
        accepted: int,
        draft_seconds: float,
        verify_seconds: float,
        rtt_seconds: float = 0.0,
        draft_cost_representative: bool = True,
        setup_seconds: float = 0.0,
    ) -> None:
        """A round of ``k`` draft tokens with ``accepted`` of them kept (then one target token).

        ``draft_cost_representative=False`` (the draft first caught up on many plain tokens)
        keeps ``draft_seconds`` out of the per-token draft cost; ``setup_seconds`` (the draft starting
        on the prompt) counts in the measured rate only, never in the per-token costs."""
        if not 0 <= accepted <= k or k < 1:
            raise ValueError("need k >= 1 and 0 <= accepted <= k")
        for hit in [1.0] * accepted + ([0.0] if accepted < k else []):
            self._alpha_seen += 1
            w = max(self.config.alpha_weight, 1.0 / (self._alpha_seen + self.config.alpha_prior_tokens))
            self.alpha += w * (hit - self.alpha)
        if draft_cost_representative or self.t_draft is None:
            self.t_draft = self._ewma(self.t_draft, draft_seconds / k)
        self.rtt = self._ewma(self.rtt, rtt_seconds)
        if k <= self.config.draft_max_tokens:
            self._verify[k] = self._ewma(self._verify.get(k), verify_seconds)
        self._rounds += 1
        self._rounds_on += 1
        self._rounds_since_plain += 1
        spent = draft_seconds + verify_seconds + rtt_seconds + max(0.0, setup_seconds)
        if self._speculating:  # honest: catch-up included
            self._spec_recent.append(max(0.0, spent) / (accepted + 1))
        self._drafted += k
        self._accepted += accepted
        self._spec_tokens += accepted + 1
        self._spec_seconds += spent
        if not self._speculating:
            self._probe_round(accepted, spent, draft_cost_representative)

    def _probe_round(self, accepted: int, spent: float, representative: bool) -> None:
        """A round while speculation is off: part of a probe; at its end, resume only when the
        probe's measured speedup AND the predicted one reach ``resume_speedup``."""
        c = self.config
        self._probe_left = max(0, self._probe_left - 1)
        if representative:
            self._probe[0] += accepted + 1
            self._probe[1] += spent
        plain = self.t_plain_recent
        if self._probe_left or not self._probe[0] or not plain:
            return
        per_token = self._probe[1] / self._probe[0]
        if (
            plain / max(per_token, 1e-12) >= c.resume_speedup
            and self.alpha >= c.min_acceptance
            and self.best_k()[1] >= c.resume_speedup
        ):
            self._speculating = True
            self._rounds_on = 0
            self._spec_recent.clear()  # start from the probe, not from the figures that stopped it
            self._spec_recent.append(per_token)
            self._reprobe_every = c.reprobe_after_tokens

    def _ewma(self, old: float | None, sample: float) -> float:
        sample = max(0.0, float(sample))
        return sample if old is None else old + self.config.cost_weight * (sample - old)

    def statistics(self) -> SpeculationStats:
        measured = 0.0
        if self._spec_seconds > 0 and self.t_target:
            measured = (self._spec_tokens / self._spec_seconds) * self.t_target
        k = self.best_k()[0] if self.t_draft is not None and self.t_target is not None else self._last_k
        return SpeculationStats(
            acceptance_rate=self.alpha,
            tokens_per_round=self._spec_tokens / self._rounds if self._rounds else 0.0,
            k=k,
            predicted_speedup=self.predicted_speedup(k) if self._speculating else 1.0,
            measured_speedup=measured,
            rounds=self._rounds,
            draft_tokens=self._drafted,
            accepted_tokens=self._accepted,
            target_only_tokens=self._plain_tokens,
            speculating=self._speculating,
        )
