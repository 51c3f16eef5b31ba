"""SLO-aware target selection: eligibility, cooldown, affinity, scoring and the mode rule.

``decide()`` is pure apart from the ``SchedulerState`` it is given (affinity table, counters and
a bounded decision log); time is injected. See docs/scheduler.md for the formula.
"""

from __future__ import annotations

from typing import Any
import dataclasses
from collections import deque
from dataclasses import dataclass

from hydra_node.routing._affinity import (
    MAX_AFFINITY_ENTRIES,
    AffinityEntry,
    AffinityTable,
    affinity_keys,
    request_features,
)
from hydra_node.routing.scheduler_config import SchedulerConfig, SchedulerConfigError, SchedulerMode
from hydra_node.routing._score import (
    MAX_TERM_MS,
    Candidate,
    RequestFeatures,
    ScoreBreakdown,
    cooldown_ms,
    cooling_until,
    score,
)
from hydra_node.routing.telemetry import Target, TargetView, TelemetryStore

__all__ = [
    "MAX_AFFINITY_ENTRIES",
    "MAX_TERM_MS",
    "AffinityTable",
    "Candidate",
    "Decision",
    "DECISION_LOG_SIZE",
    "RequestFeatures",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerConfigError",
    "SchedulerMode",
    "SchedulerState",
    "ScoreBreakdown",
    "affinity_keys",
    "cooldown_ms",
    "cooling_until",
    "decide",
    "request_features",
    "score",
]

#: Decisions kept for status; each holds at most ``MAX_LOGGED_SCORES`` breakdowns.
DECISION_LOG_SIZE = 64
MAX_LOGGED_SCORES = 8


@dataclass(frozen=True)
class Decision:
    """One routing decision; ``target`` is where the request goes (None: nowhere eligible)."""

    at: float
    mode: SchedulerMode
    target: Target | None
    baseline: Target | None
    scheduled: Target | None  # what scoring picked (routed in active mode, recorded in shadow)
    affinity_target: Target | None
    override: bool  # routed target differs from the baseline
    disagreement: bool  # scheduled differs from baseline (counted in shadow mode)
    reason: str
    scores: tuple[ScoreBreakdown, ...]  # eligible candidates, best first
    excluded: tuple[tuple[Target, str], ...]

    def as_dict(self) -> dict[str, Any]:
        def label(t: Target | None) -> str | None:
            return None if t is None else t.label()

        return {
            "at": self.at,
            "mode": self.mode.value,
            "target": label(self.target),
            "baseline": label(self.baseline),
            "scheduled": label(self.scheduled),
            "affinity_target": label(self.affinity_target),
            "override": self.override,
            "disagreement": self.disagreement,
            "reason": self.reason,
            "scores": [s.as_dict() for s in self.scores[:MAX_LOGGED_SCORES]],
            "excluded": [{"target": t.label(), "reason": r} for t, r in self.excluded[:MAX_LOGGED_SCORES]],
        }


class SchedulerState:
    """Mutable scheduler memory: affinity table, counters, last ``DECISION_LOG_SIZE`` decisions."""

    def __init__(self, *, max_affinity: int = MAX_AFFINITY_ENTRIES, log_size: int = DECISION_LOG_SIZE) -> None:
        self.affinity = AffinityTable(max_affinity)
        self.log: deque[Decision] = deque(maxlen=log_size)
        self.counters = {
            "decisions": 0,
            "no_target": 0,
            "overrides": 0,
            "shadow_disagreements": 0,
            "affinity_hits": 0,
            "affinity_overrides": 0,
            "cooling_candidates": 0,
        }

    def status(self, config: SchedulerConfig, recent: int = 16) -> dict[str, Any]:
        """Plain data for ``/api/status.scheduler``."""
        return {
            "mode": config.mode.value,
            "config": config.as_dict(),
            **self.counters,
            "affinity_entries": len(self.affinity),
            "max_affinity_entries": self.affinity.max_entries,
            "decision_log_size": self.log.maxlen,
            "recent_decisions": [d.as_dict() for d in list(self.log)[-recent:][::-1]],
        }


def _eligibility(c: Candidate, request: RequestFeatures) -> str | None:
    if c.target.model != request.model:
        return "other model"
    if not c.healthy:
        return "unhealthy"
    if not c.hosts_model:
        return "model not hosted"
    if c.context_length < request.context_needed():
        return f"context {c.context_length} < {request.context_needed()}"
    return None


def _baseline_key(c: Candidate, view: TargetView) -> tuple[int, int, float, Target]:
    rtt = 0.0 if c.is_local else (view.rtt_ms if view.rtt_ms is not None else float("inf"))
    return (c.queue_depth or 0, c.in_flight, rtt, c.target)


def decide(
    candidates: list[Candidate],
    request: RequestFeatures,
    telemetry: TelemetryStore,
    config: SchedulerConfig,
    now: float,
    state: SchedulerState,
    baseline: Target | None = None,
) -> Decision:
    """Choose a target for ``request`` and record the choice in ``state``.

    Order: eligibility (model, health, hosting, context) -> affinity lookup -> score (a cooling
    target pays its remaining back-off as a cost term) -> mode rule (off/shadow: baseline routes;
    active: the scored choice routes, an affinity target is kept unless beaten by more than
    ``affinity_override_threshold_ms``).

    ``baseline``: the caller's own fixed rule (the live router passes its ``off`` choice: local
    first, then lowest queue, then RTT). When given and eligible it replaces the built-in baseline,
    so ``off``/``shadow`` route exactly what that rule picks and disagreements are counted against it.
    """
    counters = state.counters
    counters["decisions"] += 1
    if request.expected_output_tokens is None:
        expected = telemetry.expected_output_tokens(request.model)
        if expected is not None:
            request = dataclasses.replace(request, expected_output_tokens=max(1, round(expected)))
    excluded: list[tuple[Target, str]] = []
    eligible: list[Candidate] = []
    seen: set[Target] = set()
    for c in candidates:
        why = "duplicate candidate" if c.target in seen else _eligibility(c, request)
        if why is None:
            seen.add(c.target)
            eligible.append(c)
        else:
            excluded.append((c.target, why))
    views = {c.target: telemetry.view(c.target, now, config.stale_after_ms) for c in eligible}
    cooling = sum(1 for c in eligible if (until := cooling_until(views[c.target], config)) is not None and now < until)
    counters["cooling_candidates"] += cooling
    if not eligible:
        counters["no_target"] += 1
        decision = Decision(
            now, config.mode, None, None, None, None, False, False, "no eligible candidate", (), tuple(excluded)
        )
        state.log.append(decision)
        return decision

    targets = {c.target for c in eligible}
    aff: AffinityEntry | None = None
    for key in (request.session_key, request.prefix_key):
        entry = state.affinity.get(key, now)
        if entry is not None and entry.target in targets:
            aff = entry
            break
    scores = {
        c.target: score(
            c,
            request,
            views[c.target],
            config,
            now,
            affinity=aff is not None and aff.target == c.target,
            affinity_tokens=aff.tokens if aff else 0,
        )
        for c in eligible
    }
    if len(scores) > 1:  # a failure is paid again as the best other target's TTFT
        by_ttft = sorted(scores.values(), key=lambda s: (s.predicted_ttft_ms, s.target))
        for c in eligible:
            view = views[c.target]
            if view.success_rate is not None and view.success_rate < 1.0:
                alt = by_ttft[1] if by_ttft[0].target == c.target else by_ttft[0]
                scores[c.target] = score(
                    c,
                    request,
                    view,
                    config,
                    now,
                    affinity=aff is not None and aff.target == c.target,
                    affinity_tokens=aff.tokens if aff else 0,
                    retry_ttft_ms=alt.predicted_ttft_ms,
                )
    ranked = tuple(sorted(scores.values(), key=lambda s: (s.total_ms, s.target)))
    load = {c.target: c.in_flight / c.slots for c in eligible}
    margin = abs(ranked[0].total_ms) * config.balance_margin
    near = [s for s in ranked if s.total_ms <= ranked[0].total_ms + margin]
    best = min(near, key=lambda s: (load[s.target], s.total_ms, s.target))
    if aff is not None:
        kept = best.total_ms + config.affinity_override_threshold_ms >= scores[aff.target].total_ms
        scheduled = aff.target if kept else best.target
        why = "affinity kept" if kept else f"affinity beaten by > {config.affinity_override_threshold_ms:g} ms"
    else:
        scheduled = best.target
        why = "lowest score" if best is ranked[0] else "within balance margin, least loaded"
    if baseline is None or baseline not in targets:
        baseline = (
            aff.target if aff is not None else min(eligible, key=lambda c: _baseline_key(c, views[c.target])).target
        )

    mode = config.mode
    routed = scheduled if mode is SchedulerMode.ACTIVE else baseline
    disagreement = scheduled != baseline
    if mode is SchedulerMode.SHADOW and disagreement:
        counters["shadow_disagreements"] += 1
    override = routed != baseline
    counters["overrides"] += override
    if aff is not None:
        counters["affinity_hits"] += routed == aff.target
        counters["affinity_overrides"] += routed != aff.target
    reason = {
        SchedulerMode.OFF: "off: baseline (affinity, then lowest queue, then lowest RTT)",
        SchedulerMode.SHADOW: f"shadow: baseline routed; scheduler: {why}",
        SchedulerMode.ACTIVE: f"active: {why}",
    }[mode]

    ttl_s = config.affinity_ttl_ms / 1000.0
    state.affinity.put(request.session_key, routed, request.prompt_tokens, now, ttl_s)
    state.affinity.put(request.prefix_key, routed, request.prefix_tokens, now, ttl_s)
    decision = Decision(
        now,
        mode,
        routed,
        baseline,
        scheduled,
        aff.target if aff else None,
        override,
        disagreement,
        reason,
        ranked,
        tuple(excluded),
    )
    state.log.append(decision)
    return decision


class Scheduler:
    """Convenience bundle of config, telemetry and state for the router."""

    def __init__(self, config: SchedulerConfig, telemetry: TelemetryStore | None = None) -> None:
        self.config = config
        self.telemetry = (
            telemetry if telemetry is not None else TelemetryStore(stale_after_secs=config.stale_after_ms / 1000.0)
        )
        self.state = SchedulerState()

    def decide(
        self, candidates: list[Candidate], request: RequestFeatures, now: float, baseline: Target | None = None
    ) -> Decision:
        return decide(candidates, request, self.telemetry, self.config, now, self.state, baseline)

    def status(self) -> dict[str, Any]:
        return self.state.status(self.config)
