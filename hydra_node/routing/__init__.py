"""Routing: measured telemetry per target and the SLO-aware scheduler (pure, time injected); the
router (`router`) with its pure parts: continuing a stream whose host failed (`continuation`),
waiting for a model that is coming back (`target_wait`), handing streams over on stop
(`handover`), and the model identity a continuation checks (`identity`)."""

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
