"""Pure scoring: one candidate, one request, measured telemetry -> predicted cost in ms."""

from __future__ import annotations

from typing import Any
import math
from dataclasses import dataclass

from hydra_node.routing.scheduler_config import SchedulerConfig
from hydra_node.routing.telemetry import Target, TargetView

#: Any term is clamped to this (about 11.6 days), so a score is always finite and comparable.
MAX_TERM_MS = 1e9
#: Largest exponent of the back-off (2^16 x base is far past any sane cap).
_MAX_BACKOFF_SHIFT = 16


def _finite_positive(owner: str, name: str, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{owner}.{name}: expected a finite value > 0, got {value!r}")


@dataclass(frozen=True)
class Candidate:
    """A target as the router knows it now (membership, gossip, own in-flight count)."""

    target: Target
    context_length: int
    healthy: bool = True
    hosts_model: bool = True  # the node can serve target.model at all
    model_loaded: bool = True  # False: routing here pays a cold start
    in_flight: int = 0  # requests outstanding at the target (ours, or the larger of ours and gossip)
    queue_depth: int | None = None  # requests waiting there (gossip); None = unknown
    slots: int = 1  # concurrent requests the target serves
    advertised_decode_tps: float | None = None
    advertised_prefill_tps: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.target, Target):
            raise ValueError("Candidate.target: expected a Target")
        for name in ("context_length", "in_flight"):
            if getattr(self, name) < 0:
                raise ValueError(f"Candidate.{name}: must be >= 0")
        if self.queue_depth is not None and self.queue_depth < 0:
            raise ValueError("Candidate.queue_depth: must be >= 0")
        if self.slots < 1:
            raise ValueError("Candidate.slots: must be >= 1")
        _finite_positive("Candidate", "advertised_decode_tps", self.advertised_decode_tps)
        _finite_positive("Candidate", "advertised_prefill_tps", self.advertised_prefill_tps)

    @property
    def is_local(self) -> bool:
        return self.target.is_local


@dataclass(frozen=True)
class RequestFeatures:
    """What the router knows about a request before sending it."""

    model: str
    prompt_tokens: int
    max_tokens: int | None = None
    expected_output_tokens: int | None = None  # filled by decide() from telemetry when None
    session_key: str | None = None  # see affinity_keys()
    prefix_key: str | None = None
    prefix_tokens: int = 0  # tokens covered by prefix_key (system prompt and first message)
    kv_transfer_bytes: int = 0  # KV state that must move to the target before decoding

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "prefix_tokens", "kv_transfer_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"RequestFeatures.{name}: must be >= 0")
        for name in ("max_tokens", "expected_output_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"RequestFeatures.{name}: must be >= 1")

    def context_needed(self) -> int:
        return self.prompt_tokens + (self.max_tokens or 1)

    def output_tokens(self, config: SchedulerConfig) -> int:
        out = self.expected_output_tokens or self.max_tokens or config.default_output_tokens
        return min(out, self.max_tokens) if self.max_tokens else out


@dataclass(frozen=True)
class ScoreBreakdown:
    """Every term in ms; ``total_ms`` is what the scheduler minimises."""

    target: Target
    queue_ms: float
    network_ms: float
    prefill_ms: float
    decode_ms: float
    cold_start_ms: float
    kv_transfer_ms: float
    failure_ms: float
    cooldown_ms: float
    unknown_ms: float
    ttft_budget_ms: float
    tpot_budget_ms: float
    affinity_credit_ms: float
    predicted_ttft_ms: float
    predicted_tpot_ms: float
    cached_tokens: int
    total_ms: float

    def as_dict(self) -> dict[str, Any]:
        data = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}
        data["target"] = self.target.label()
        return data


def cooldown_ms(consecutive_failures: int, config: SchedulerConfig) -> float:
    """Back-off after ``consecutive_failures``: base x 2^(n-1), capped at ``cooldown_max_ms``."""
    if consecutive_failures <= 0:
        return 0.0
    shift = min(consecutive_failures - 1, _MAX_BACKOFF_SHIFT)
    return min(config.cooldown_max_ms, config.cooldown_base_ms * (1 << shift))


def cooling_until(view: TargetView, config: SchedulerConfig) -> float | None:
    """When the target's cooldown ends (seconds, the store's clock); None if it is not cooling."""
    if view.consecutive_failures <= 0 or view.last_failure_at is None:
        return None
    return view.last_failure_at + cooldown_ms(view.consecutive_failures, config) / 1000.0


def _clamp(value: float) -> float:
    if not math.isfinite(value):
        return MAX_TERM_MS
    return min(MAX_TERM_MS, max(0.0, value))


def score(
    candidate: Candidate,
    request: RequestFeatures,
    view: TargetView,
    config: SchedulerConfig,
    now: float,
    *,
    affinity: bool = False,
    affinity_tokens: int = 0,
    retry_ttft_ms: float = 0.0,
) -> ScoreBreakdown:
    """Predicted cost of sending ``request`` to ``candidate``; lower is better.

    ``affinity``: the request's session or prefix was last routed to this candidate, which is
    assumed to still hold ``affinity_tokens`` of its prompt in cache. ``retry_ttft_ms``: the
    predicted TTFT of the best other target, paid again when this one fails.
    """
    out = request.output_tokens(config)
    tpot = view.tpot_ms
    if tpot is None:
        tpot = 1000.0 / candidate.advertised_decode_tps if candidate.advertised_decode_tps else config.default_tpot_ms
    per_token = view.prefill_ms_per_token
    if per_token is None:
        per_token = (
            1000.0 / candidate.advertised_prefill_tps
            if candidate.advertised_prefill_tps
            else config.default_prefill_ms_per_token
        )
    cached = min(request.prompt_tokens, max(0, affinity_tokens)) if affinity else 0
    prefill = _clamp((request.prompt_tokens - cached) * per_token)
    decode_full = _clamp(out * tpot)
    decode = _clamp(decode_full * config.decode_weight)

    # Expected wait: requests ahead of us divided over the slots, each taking a service time.
    ahead = max(0, candidate.in_flight - candidate.slots + 1)
    if candidate.queue_depth:
        ahead = max(ahead, candidate.queue_depth + 1)
    service = view.service_ms if view.service_ms is not None else prefill + decode_full
    queue = _clamp(ahead * service / candidate.slots)
    if candidate.queue_depth is None and view.queue_wait_ms is not None:
        queue = max(queue, _clamp(view.queue_wait_ms))  # others may be queued there too

    network = 0.0
    if not candidate.is_local and view.rtt_ms is not None:
        network = _clamp(view.rtt_ms + (view.jitter_ms or 0.0))
    cold = 0.0
    if not candidate.model_loaded:
        cold = _clamp(config.default_cold_start_ms if view.artifact_ms is None else view.artifact_ms)
    kv = 0.0
    if request.kv_transfer_bytes:
        if view.bandwidth_bps:
            kv = _clamp(request.kv_transfer_bytes * 1000.0 / view.bandwidth_bps)
        elif view.kv_transfer_ms is not None:
            kv = _clamp(view.kv_transfer_ms)
        else:
            kv = _clamp(request.kv_transfer_bytes * 1000.0 / config.default_bandwidth_bps)

    failure = 0.0
    if view.success_rate is not None:
        p_fail = 1.0 - min(1.0, max(0.0, view.success_rate))
        failure = _clamp(p_fail * (config.failure_penalty_ms + (view.failure_ms or 0.0) + _clamp(retry_ttft_ms)))
    cooldown = 0.0
    until = cooling_until(view, config)
    if until is not None and until > now:
        cooldown = _clamp((until - now) * 1000.0)  # as if waiting for the back-off to end
    unknown = 0.0
    if not candidate.is_local and not view.measured:
        unknown = config.unknown_remote_penalty_ms * (config.hint_discount if view.hinted else 1.0)

    ttft = _clamp(queue + network + prefill + cold + kv)
    # SLO terms: the excess over a budget, saturating at one budget (past that the SLO is lost
    # anyway and the raw predicted time decides).
    ttft_excess = min(max(0.0, ttft - config.ttft_budget_ms), config.ttft_budget_ms)
    tpot_excess = min(max(0.0, tpot - config.tpot_budget_ms), config.tpot_budget_ms)
    ttft_pen = _clamp(ttft_excess * config.budget_penalty_weight)
    tpot_pen = _clamp(tpot_excess * out * config.budget_penalty_weight)
    credit = 0.0
    if affinity:
        reuse = 1.0 if view.cache_hit_ratio is None else min(1.0, max(0.0, view.cache_hit_ratio))
        credit = config.cache_affinity_credit_ms * reuse
    total = queue + network + prefill + decode + cold + kv + failure + cooldown + unknown + ttft_pen + tpot_pen - credit
    return ScoreBreakdown(
        target=candidate.target,
        queue_ms=queue,
        network_ms=network,
        prefill_ms=prefill,
        decode_ms=decode,
        cold_start_ms=cold,
        kv_transfer_ms=kv,
        failure_ms=failure,
        cooldown_ms=cooldown,
        unknown_ms=unknown,
        ttft_budget_ms=ttft_pen,
        tpot_budget_ms=tpot_pen,
        affinity_credit_ms=credit,
        predicted_ttft_ms=ttft,
        predicted_tpot_ms=_clamp(tpot),
        cached_tokens=cached,
        total_ms=max(-MAX_TERM_MS, min(10 * MAX_TERM_MS, total)),
    )
