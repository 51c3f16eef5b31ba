"""Bounded, local-first network and serving telemetry per target (node, model).

Everything here is sans-IO: callers pass ``now`` (seconds, e.g. ``trio.current_time()``) and
durations in milliseconds. Own measurements always win over peers' advisory hints.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any

from hydra_node.routing._hints import (
    MAX_NAME_CHARS,
    MAX_SUMMARY_ENTRIES,
    HintRecord,
    InvalidHint,
    decode_values,
    encode_entry,
    parse_summary,
)
from hydra_node.routing.metric import EWMA_ALPHA, WINDOW_SAMPLES, Metric

__all__ = ["EWMA_ALPHA", "WINDOW_SAMPLES", "InvalidHint", "Target", "TargetView", "TelemetryStore"]

LOCAL = "local"
#: Targets tracked at once (least-recently-updated evicted); 256 peers x models is a large mesh.
MAX_TARGETS = 256
#: Models tracked per node; one node rarely serves more, and a peer cannot flood us with model ids.
MAX_MODELS_PER_NODE = 16
#: Models whose output-length average is kept (for expected decode length).
MAX_MODELS = 128
#: Targets holding peer hints, and peers remembered per target (LRU).
MAX_HINT_TARGETS = 256
MAX_HINT_SOURCES = 4
#: Own entries untouched this long are dropped (upstream: 20 minutes).
TTL_SECS = 1200.0
#: Own values older than this are "stale": shown, but not used for scoring.
STALE_AFTER_SECS = 15.0
#: Hints older than this (from the peer's observation time) are ignored and pruned.
HINT_TTL_SECS = 60.0

_METRICS = (
    "queue_wait_ms",
    "rtt_ms",
    "jitter_ms",
    "bandwidth_bps",
    "ttft_ms",
    "tpot_ms",
    "tokens_per_s",
    "prefill_ms_per_token",
    "prefill_ms",
    "prefill_tokens",
    "service_ms",
    "output_tokens",
    "cache_hit_ratio",
    "kv_transfer_ms",
    "artifact_ms",
    "failure_ms",
    "success_rate",
)


@dataclass(frozen=True, order=True)
class Target:
    """Where a request can go: a node (``"local"`` for this node) serving a model."""

    node: str
    model: str

    def __post_init__(self) -> None:
        for name in ("node", "model"):
            value = getattr(self, name)
            if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
                raise ValueError(f"Target.{name}: expected text of 1..{MAX_NAME_CHARS} characters")

    @property
    def is_local(self) -> bool:
        return self.node == LOCAL

    def label(self) -> str:
        return f"{self.node}/{self.model}"


@dataclass(frozen=True)
class TargetView:
    """What the scorer may use about one target: fresh values only (None = unknown)."""

    queue_wait_ms: float | None = None
    rtt_ms: float | None = None
    jitter_ms: float | None = None
    bandwidth_bps: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    tokens_per_s: float | None = None
    prefill_ms_per_token: float | None = None  # average prefill ms / average uncached tokens
    service_ms: float | None = None
    output_tokens: float | None = None
    cache_hit_ratio: float | None = None
    kv_transfer_ms: float | None = None
    artifact_ms: float | None = None
    failure_ms: float | None = None
    success_rate: float | None = None
    consecutive_failures: int = 0
    last_failure_at: float | None = None
    measured: bool = False  # at least one own fresh value
    hinted: bool = False  # at least one value came from a peer hint

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _METRICS and value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"TargetView.{f.name}: expected a finite value >= 0, got {value!r}")


class _TargetStats:
    __slots__ = (
        "metrics",
        "successes",
        "failures",
        "consecutive_failures",
        "last_failure_at",
        "last_rtt",
        "prompt_tokens",
        "cached_tokens",
        "updated_at",
    )

    def __init__(self) -> None:
        self.metrics = {name: Metric() for name in _METRICS}
        self.successes = self.failures = self.consecutive_failures = 0
        self.prompt_tokens = self.cached_tokens = 0
        self.last_failure_at: float | None = None
        self.last_rtt: float | None = None
        self.updated_at = 0.0


class TelemetryStore:
    """Per-target observations with named caps (see module constants); LRU by last update."""

    def __init__(
        self,
        *,
        max_targets: int = MAX_TARGETS,
        max_models_per_node: int = MAX_MODELS_PER_NODE,
        ttl_secs: float = TTL_SECS,
        stale_after_secs: float = STALE_AFTER_SECS,
        hint_ttl_secs: float = HINT_TTL_SECS,
        local_node_id: str | None = None,
    ) -> None:
        if max_targets < 1 or max_models_per_node < 1 or ttl_secs <= 0 or stale_after_secs <= 0:
            raise ValueError("TelemetryStore: caps and TTLs must be positive")
        self.max_targets, self.max_models_per_node = max_targets, max_models_per_node
        self.ttl_secs, self.stale_after_secs, self.hint_ttl_secs = ttl_secs, stale_after_secs, hint_ttl_secs
        self.local_node_id = local_node_id
        self._targets: OrderedDict[Target, _TargetStats] = OrderedDict()
        self._per_node: dict[str, int] = {}
        self._model_output: OrderedDict[str, Metric] = OrderedDict()
        self._hints: OrderedDict[Target, OrderedDict[str, HintRecord]] = OrderedDict()

    # ---- bookkeeping -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._targets)

    def targets(self) -> list[Target]:
        return list(self._targets)

    def _stats(self, target: Target, now: float) -> _TargetStats:
        self._prune(now)
        stats = self._targets.get(target)
        if stats is None:
            if self._per_node.get(target.node, 0) >= self.max_models_per_node:
                self._evict(next(t for t in self._targets if t.node == target.node))
            while len(self._targets) >= self.max_targets:
                self._evict(next(iter(self._targets)))
            stats = self._targets[target] = _TargetStats()
            self._per_node[target.node] = self._per_node.get(target.node, 0) + 1
        self._targets.move_to_end(target)
        stats.updated_at = now
        return stats

    def _evict(self, target: Target) -> None:
        del self._targets[target]
        left = self._per_node[target.node] - 1
        if left:
            self._per_node[target.node] = left
        else:
            del self._per_node[target.node]

    def _prune(self, now: float) -> None:
        while self._targets:
            oldest, stats = next(iter(self._targets.items()))
            if now - stats.updated_at <= self.ttl_secs:
                break
            self._evict(oldest)

    def _add(self, target: Target, now: float, **values: float | None) -> _TargetStats:
        stats = self._stats(target, now)
        for name, value in values.items():
            if value is not None:
                stats.metrics[name].add(value, now)
        return stats

    # ---- observations ------------------------------------------------------------------------
    def observe_queue_wait(self, target: Target, queue_wait_ms: float, now: float) -> None:
        self._add(target, now, queue_wait_ms=queue_wait_ms)

    def observe_probe(self, target: Target, rtt_ms: float, now: float) -> None:
        """A link probe round trip; jitter is the EWMA of |RTT - previous RTT| (RFC 3550 style)."""
        stats = self._add(target, now, rtt_ms=rtt_ms)
        if math.isfinite(rtt_ms) and rtt_ms >= 0:
            if stats.last_rtt is not None:
                stats.metrics["jitter_ms"].add(abs(rtt_ms - stats.last_rtt), now)
            stats.last_rtt = rtt_ms

    def observe_transfer(self, target: Target, nbytes: int, duration_ms: float, now: float) -> None:
        """A bulk transfer of ``nbytes`` that took ``duration_ms``: feeds the bandwidth estimate."""
        if nbytes > 0 and duration_ms > 0:
            self._add(target, now, bandwidth_bps=nbytes * 1000.0 / duration_ms)

    def observe_ttft(self, target: Target, ttft_ms: float, now: float) -> None:
        self._add(target, now, ttft_ms=ttft_ms)

    def observe_prefill(self, target: Target, prefill_ms: float, uncached_tokens: int, now: float) -> None:
        """Prefill of ``uncached_tokens`` took ``prefill_ms`` (server timing or TTFT - queue - RTT)."""
        if uncached_tokens > 0 and math.isfinite(prefill_ms) and prefill_ms >= 0:
            self._add(
                target,
                now,
                prefill_ms_per_token=prefill_ms / uncached_tokens,
                prefill_ms=prefill_ms,
                prefill_tokens=uncached_tokens,
            )

    def observe_tpot(self, target: Target, tpot_ms: float, now: float) -> None:
        self._add(target, now, tpot_ms=tpot_ms)

    def observe_cache(self, target: Target, prompt_tokens: int, cached_tokens: int, now: float) -> None:
        """Prompt-prefix reuse: ``cached_tokens`` of ``prompt_tokens`` were served from cache."""
        if prompt_tokens <= 0 or not 0 <= cached_tokens <= prompt_tokens:
            return
        stats = self._add(target, now, cache_hit_ratio=cached_tokens / prompt_tokens)
        stats.prompt_tokens += prompt_tokens
        stats.cached_tokens += cached_tokens

    def observe_kv_transfer(self, target: Target, duration_ms: float, now: float, nbytes: int = 0) -> None:
        self._add(target, now, kv_transfer_ms=duration_ms)
        if nbytes > 0:
            self.observe_transfer(target, nbytes, duration_ms, now)

    def observe_artifact(self, target: Target, duration_ms: float, now: float) -> None:
        """Time to materialise the model's artifacts (download, load) on the target: its cold start."""
        self._add(target, now, artifact_ms=duration_ms)

    def observe_success(self, target: Target, now: float) -> None:
        stats = self._add(target, now, success_rate=1.0)
        stats.successes += 1
        stats.consecutive_failures = 0

    def observe_failure(self, target: Target, now: float, elapsed_ms: float = 0.0) -> None:
        """A failure the target is to blame for (timeout, unavailable, 5xx), after ``elapsed_ms``.

        Context overflow, client disconnects and rejections by policy are not the target's fault:
        do not report them.
        """
        stats = self._add(target, now, success_rate=0.0, failure_ms=elapsed_ms)
        stats.failures += 1
        stats.consecutive_failures += 1
        stats.last_failure_at = now

    def observe_request(
        self,
        target: Target,
        now: float,
        *,
        queue_wait_ms: float,
        ttft_ms: float,
        duration_ms: float,
        prompt_tokens: int,
        cached_tokens: int = 0,
        completion_tokens: int = 0,
        network_ms: float | None = None,
    ) -> None:
        """A finished, successful request, as the router saw it; feeds every derived metric.

        ``network_ms`` is the round trip included in ``ttft_ms`` (default: the current RTT EWMA).
        Raises ``ValueError`` for negative or non-finite durations (a bug in the caller).
        """
        if not all(math.isfinite(v) and v >= 0 for v in (queue_wait_ms, ttft_ms, duration_ms)):
            raise ValueError("observe_request: durations must be finite and >= 0")
        stats = self._stats(target, now)
        rtt = stats.metrics["rtt_ms"].ewma if network_ms is None else network_ms
        self.observe_queue_wait(target, queue_wait_ms, now)
        self.observe_ttft(target, ttft_ms, now)
        self.observe_cache(target, prompt_tokens, cached_tokens, now)
        self.observe_prefill(
            target, max(0.0, ttft_ms - queue_wait_ms - (rtt or 0.0)), prompt_tokens - cached_tokens, now
        )
        self._add(target, now, service_ms=max(0.0, duration_ms - queue_wait_ms))
        if completion_tokens > 0:
            stats.metrics["output_tokens"].add(completion_tokens, now)
            self._model_metric(target.model).add(completion_tokens, now)
            if duration_ms > 0:
                stats.metrics["tokens_per_s"].add(completion_tokens * 1000.0 / duration_ms, now)
        if completion_tokens > 1:
            self.observe_tpot(target, (duration_ms - ttft_ms) / (completion_tokens - 1), now)
        self.observe_success(target, now)

    def _model_metric(self, model: str) -> Metric:
        metric = self._model_output.get(model)
        if metric is None:
            while len(self._model_output) >= MAX_MODELS:
                self._model_output.popitem(last=False)
            metric = self._model_output[model] = Metric()
        self._model_output.move_to_end(model)
        return metric

    # ---- reading -----------------------------------------------------------------------------
    def expected_output_tokens(self, model: str) -> float | None:
        """Average completion length seen for ``model`` across targets, if any."""
        metric = self._model_output.get(model)
        return None if metric is None else metric.ewma

    def view(self, target: Target, now: float, stale_after_ms: float | None = None) -> TargetView:
        """Fresh own values, else fresh peer hints (averaged over peers), else None."""
        stale_s = self.stale_after_secs if stale_after_ms is None else stale_after_ms / 1000.0
        stats = self._targets.get(target)
        own: dict[str, Any] = {}  # TargetView's fields, by name
        extra: dict[str, Any] = {}
        if stats is not None:
            own = self._own_fresh(stats, now, stale_s)
            extra = {"consecutive_failures": stats.consecutive_failures, "last_failure_at": stats.last_failure_at}
        hinted: dict[str, Any] = {k: v for k, v in self._hint_values(target, now).items() if k not in own}
        return TargetView(**own, **hinted, **extra, measured=bool(own), hinted=bool(hinted))

    @staticmethod
    def _own_fresh(stats: _TargetStats, now: float, stale_s: float) -> dict[str, float]:
        own = {}
        for name, metric in stats.metrics.items():
            value = metric.fresh(now, stale_s)
            if value is not None:
                own[name] = value
        # Ratio of averages, not average of ratios: a fixed per-request overhead would otherwise
        # inflate the per-token rate of short prompts.
        ms, tokens = own.pop("prefill_ms", None), own.pop("prefill_tokens", None)
        if ms is not None and tokens:
            own["prefill_ms_per_token"] = ms / tokens
        return own

    def _hint_values(self, target: Target, now: float) -> dict[str, float]:
        sources = self._hints.get(target)
        if not sources:
            return {}
        sums: dict[str, list[float]] = {}
        for record in sources.values():
            if now - record.observed_at <= self.hint_ttl_secs:
                for name, value in record.values:
                    sums.setdefault(name, []).append(value)
        return {name: sum(vals) / len(vals) for name, vals in sums.items()}

    # ---- gossip ------------------------------------------------------------------------------
    def summary(self, now: float) -> dict:
        """Our own fresh measurements, most recent first, as a CBOR-friendly advisory summary."""
        self._prune(now)
        entries = []
        for target in reversed(self._targets):
            stats = self._targets[target]
            own = self._own_fresh(stats, now, self.stale_after_secs)
            if not own.keys() & {"success_rate", "ttft_ms", "tpot_ms", "prefill_ms_per_token"}:
                continue
            age_ms = int(max(0.0, now - stats.updated_at) * 1000)
            samples = stats.successes + stats.failures
            entries.append(encode_entry(target.node, target.model, age_ms, samples, own))
            if len(entries) >= MAX_SUMMARY_ENTRIES:
                break
        return {"v": 1, "entries": entries}

    def merge_hint(self, from_node: str, summary: object, now: float) -> int:
        """Store a peer's summary as advisory hints; returns entries kept. Raises ``InvalidHint``."""
        if not isinstance(from_node, str) or not 0 < len(from_node) <= MAX_NAME_CHARS or from_node == LOCAL:
            raise InvalidHint("from_node: expected a peer id")
        kept = 0
        for entry in parse_summary(summary):
            node = from_node if entry["node"] == LOCAL else entry["node"]
            if node == self.local_node_id:
                continue  # we measure ourselves
            observed_at = now - entry["age_ms"] / 1000.0
            if now - observed_at > self.hint_ttl_secs:
                continue
            target = Target(node, entry["model"])
            sources = self._hints.get(target)
            if sources is None:
                while len(self._hints) >= MAX_HINT_TARGETS:
                    self._hints.popitem(last=False)
                sources = self._hints[target] = OrderedDict()
            self._hints.move_to_end(target)
            sources[from_node] = HintRecord(from_node, observed_at, entry["n"], decode_values(entry))
            sources.move_to_end(from_node)
            while len(sources) > MAX_HINT_SOURCES:
                sources.popitem(last=False)
            kept += 1
        return kept

    # ---- status ------------------------------------------------------------------------------
    def snapshot(self, now: float) -> dict:
        """Plain data for ``/api/status.network_costs``."""
        self._prune(now)
        targets = []
        stale = 0
        for target in reversed(self._targets):
            stats = self._targets[target]
            ago = max(0.0, now - stats.updated_at)
            is_stale = ago > self.stale_after_secs
            stale += is_stale
            total = stats.successes + stats.failures
            targets.append(
                {
                    "node": target.node,
                    "model": target.model,
                    "kind": "local" if target.is_local else "remote",
                    "last_updated_ms_ago": int(ago * 1000),
                    "stale": is_stale,
                    "successes": stats.successes,
                    "failures": stats.failures,
                    "consecutive_failures": stats.consecutive_failures,
                    "success_rate": round(stats.successes / total, 4) if total else None,
                    "cache_hit_rate": (
                        round(stats.cached_tokens / stats.prompt_tokens, 4) if stats.prompt_tokens else None
                    ),
                    "metrics": {name: m.as_dict(now) for name, m in stats.metrics.items() if m.count},
                }
            )
        return {
            "tracked_targets": len(self._targets),
            "stale_targets": stale,
            "max_targets": self.max_targets,
            "max_models_per_node": self.max_models_per_node,
            "ttl_secs": self.ttl_secs,
            "stale_after_secs": self.stale_after_secs,
            "ewma_alpha": EWMA_ALPHA,
            "window_samples": WINDOW_SAMPLES,
            "hinted_targets": len(self._hints),
            "advisory_hints": self.summary(now)["entries"],
            "targets": targets,
        }
