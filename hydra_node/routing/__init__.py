"""Routing: measured telemetry per target and the SLO-aware scheduler (pure, time injected)."""

from hydra_node.routing.scheduler import (
    Candidate,
    Decision,
    RequestFeatures,
    Scheduler,
    SchedulerConfig,
    SchedulerConfigError,
    SchedulerMode,
    SchedulerState,
    ScoreBreakdown,
    affinity_keys,
    cooldown_ms,
    decide,
    request_features,
    score,
)
from hydra_node.routing.telemetry import InvalidHint, Target, TargetView, TelemetryStore

__all__ = [
    "Candidate",
    "Decision",
    "InvalidHint",
    "RequestFeatures",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerConfigError",
    "SchedulerMode",
    "SchedulerState",
    "ScoreBreakdown",
    "Target",
    "TargetView",
    "TelemetryStore",
    "affinity_keys",
    "cooldown_ms",
    "decide",
    "request_features",
    "score",
]
