"""Prometheus metrics of one node: ``GET /metrics`` on the management port.

Each node has its own ``CollectorRegistry`` (never the process-global one, so several nodes in one
process, as in tests, do not mix). Two kinds of series:

* histograms and counters observed as requests finish (:meth:`NodeMetrics.observe`, which the
  composition root adds to ``LiveScheduling.listeners``): TTFT, inter-token latency, completion
  time, tokens;
* everything else is read at scrape time through :class:`MetricsSources`, callables returning the
  services' statistics: HTTP requests by path and status, queue depth, runner tokens/s and
  restarts, gossip messages, peers by state, link frames rejected, scheduler counters. Nothing is
  copied, so nothing can drift.

Label values are bounded: ``model`` takes at most ``MAX_MODEL_LABELS`` distinct values (then
``"other"``); ``target`` is ``local`` or ``remote``, never a node id.
"""

from __future__ import annotations

from collections import Counter as _Tally
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from hydra_node.http.server import Request, Response
from hydra_node.routing.router import RouterStatistics
from hydra_node.routing.live import RequestObservation, SchedulingStatistics
from hydra_node.runtime.child.stats import EngineStatistics

__all__ = ["MAX_MODEL_LABELS", "MetricsSources", "NodeMetrics", "RunnerSample"]

#: Distinct ``model`` label values per node; more models are folded into "other".
MAX_MODEL_LABELS = 32
#: Seconds; from a fast local token to a slow remote cold start.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)
#: Scheduler counters exported (``hydra_scheduler_events`` by kind).
SCHEDULER_EVENT_KINDS = (
    "decisions",
    "overrides",
    "shadow_disagreements",
    "no_target",
    "affinity_hits",
    "affinity_overrides",
)


@dataclass(frozen=True)
class RunnerSample:
    """One local runner at scrape time."""

    model: str
    queue_depth: int
    in_flight: int
    tokens_per_s: float
    restarts: int
    ready: bool
    #: The continuous-batching engine's latest figures; None before its first report or without it.
    engine: EngineStatistics | None = None


@dataclass(frozen=True)
class MetricsSources:
    """What the scrape reads, each a callable returning the current statistics."""

    #: OpenAI API requests by ``"<path> <status>"``.
    http_requests: Callable[[], Mapping[str, int]]
    runners: Callable[[], Sequence[RunnerSample]]
    routing: Callable[[], RouterStatistics]
    #: The live scheduler's statistics; None when the router runs without one.
    scheduling: Callable[[], SchedulingStatistics | None] = lambda: None
    #: The gossip driver's statistics (``hydra_node.mesh.gossip``); None without a mesh.
    gossip: Callable[[], Any] = lambda: None
    #: Statistics of each open peer link (``PeerLink.statistics()``).
    links: Callable[[], Sequence[Any]] = tuple


class NodeMetrics:
    """The node's registry. ``observe`` is a ``LiveScheduling`` listener; ``handle`` serves it."""

    def __init__(self, sources: MetricsSources) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ("model", "target")
        self.ttft = Histogram(
            "hydra_request_ttft_seconds",
            "Time to first token of routed requests, as the router measured it",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "hydra_request_itl_seconds",
            "Mean inter-token latency (TPOT) of routed requests",
            labels,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.duration = Histogram(
            "hydra_request_duration_seconds",
            "Completion time of routed requests",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "hydra_generated_tokens",
            "Completion tokens of routed requests (rate() gives tokens/s)",
            labels,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "hydra_prompt_tokens", "Prompt tokens of routed requests", labels, registry=self.registry
        )
        self.cached_tokens = Counter(
            "hydra_cached_prompt_tokens", "Prompt tokens served from a prefix cache", labels, registry=self.registry
        )
        self.registry.register(_ScrapeCollector(sources))
        self._models: set[str] = set()

    def _model(self, model: str) -> str:
        if model in self._models:
            return model
        if len(self._models) < MAX_MODEL_LABELS:
            self._models.add(model)
            return model
        return "other"

    def observe(self, obs: RequestObservation) -> None:
        labels = (self._model(obs.target.model), "local" if obs.target.is_local else "remote")
        self.ttft.labels(*labels).observe(obs.ttft_ms / 1000.0)
        self.duration.labels(*labels).observe(obs.duration_ms / 1000.0)
        if obs.completion_tokens > 1:
            self.itl.labels(*labels).observe(obs.itl_ms / 1000.0)
        self.tokens.labels(*labels).inc(obs.completion_tokens)
        self.prompt_tokens.labels(*labels).inc(obs.prompt_tokens)
        self.cached_tokens.labels(*labels).inc(obs.cached_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def handle(self, request: Request) -> Response:
        return Response(200, self.render(), CONTENT_TYPE_LATEST)


class _ScrapeCollector:
    """Series read from :class:`MetricsSources` at scrape time."""

    def __init__(self, sources: MetricsSources) -> None:
        self.sources = sources

    def describe(self):
        return []

    def collect(self):
        yield from self._http()
        yield from self._runners()
        yield from self._routing()
        yield from self._mesh()

    def _http(self):
        http = CounterMetricFamily(
            "hydra_http_requests", "OpenAI API requests by path and status", labels=("path", "status")
        )
        for key, count in sorted(self.sources.http_requests().items()):
            path, _, status = key.rpartition(" ")
            http.add_metric((path, status), count)
        yield http

    def _runners(self):
        queue = GaugeMetricFamily("hydra_queue_depth", "Requests waiting for a local runner", labels=("model",))
        inflight = GaugeMetricFamily(
            "hydra_inflight_requests", "Requests a local runner is generating", labels=("model",)
        )
        tps = GaugeMetricFamily(
            "hydra_runner_tokens_per_second", "Decode speed of a local runner (EWMA)", labels=("model",)
        )
        restarts = CounterMetricFamily("hydra_runner_restarts", "Restarts of a local runner", labels=("model",))
        up = GaugeMetricFamily("hydra_runner_ready", "1 if the local runner is ready", labels=("model",))
        batch = GaugeMetricFamily(
            "hydra_engine_batch_size",
            "Mean sequences per engine step over the latest steps (continuous batching)",
            labels=("model",),
        )
        free = GaugeMetricFamily("hydra_engine_free_slots", "Sequence slots free in a local runner", labels=("model",))
        kv_used = GaugeMetricFamily(
            "hydra_engine_kv_cells_used", "KV cache cells the active sequences use", labels=("model",)
        )
        kv_budget = GaugeMetricFamily(
            "hydra_engine_kv_cells_budget", "KV cache cells the slots may use", labels=("model",)
        )
        runners = list(self.sources.runners())[:MAX_MODEL_LABELS]
        for r in runners:
            queue.add_metric((r.model,), r.queue_depth)
            inflight.add_metric((r.model,), r.in_flight)
            tps.add_metric((r.model,), r.tokens_per_s)
            restarts.add_metric((r.model,), r.restarts)
            up.add_metric((r.model,), 1.0 if r.ready else 0.0)
            if r.engine is not None:
                batch.add_metric((r.model,), r.engine.batch_mean)
                free.add_metric((r.model,), r.engine.free_slots)
                kv_used.add_metric((r.model,), r.engine.kv_used)
                kv_budget.add_metric((r.model,), r.engine.kv_budget)
        yield from (queue, inflight, tps, restarts, up, batch, free, kv_used, kv_budget)
        yield from _prompt_cache([r for r in runners if r.engine is not None])

    def _routing(self):
        router = self.sources.routing()
        yield CounterMetricFamily("hydra_route_retries", "Requests retried on a second target", value=router.retries)
        yield CounterMetricFamily("hydra_route_no_target", "Requests with no ready target", value=router.no_target)
        yield CounterMetricFamily(
            "hydra_route_continuations",
            "Generation parts started on another target after their host failed mid-stream",
            value=router.continuations,
        )
        yield CounterMetricFamily(
            "hydra_route_continuation_failures",
            "Mid-stream failures that could not be continued (no target of the same identity, budget spent, "
            "or the continuation failed too)",
            value=router.continuation_failures,
        )
        waits = CounterMetricFamily(
            "hydra_route_target_waits",
            "Requests and continuations that waited for a target of a model expected back, by how the wait ended",
            labels=("outcome",),
        )
        for outcome, n in sorted(router.target_waits.items()):
            waits.add_metric((outcome,), n)
        yield waits
        live = self.sources.scheduling()
        if live is None:
            return
        sched = CounterMetricFamily(
            "hydra_scheduler_events", "Scheduler decisions and outcomes by kind", labels=("kind",)
        )
        for kind in SCHEDULER_EVENT_KINDS:
            sched.add_metric((kind,), live.decisions.get(kind, 0))
        yield sched
        mode = GaugeMetricFamily("hydra_scheduler_mode", "1 for the scheduler's current mode", labels=("mode",))
        for m in ("off", "shadow", "active"):
            mode.add_metric((m,), 1.0 if live.mode.value == m else 0.0)
        yield mode
        failures = CounterMetricFamily(
            "hydra_route_failures", "Failed attempts by whether the target was to blame", labels=("blamed",)
        )
        failures.add_metric(("true",), live.counters["failures_blamed"])
        failures.add_metric(("false",), live.counters["failures_not_blamed"])
        yield failures
        yield GaugeMetricFamily(
            "hydra_telemetry_tracked_targets", "Targets with measured telemetry", value=live.tracked_targets
        )
        hints = CounterMetricFamily(
            "hydra_telemetry_hint_summaries", "Peers' telemetry summaries by outcome", labels=("outcome",)
        )
        hints.add_metric(("merged",), live.counters["hint_summaries_merged"])
        hints.add_metric(("rejected",), live.counters["hint_summaries_rejected"])
        yield hints

    def _mesh(self) -> Iterator[Metric]:
        st = self.sources.gossip()
        if st is None:
            return
        msgs = CounterMetricFamily(
            "hydra_gossip_messages", "Membership messages by direction and type", labels=("direction", "type")
        )
        for direction, tally in (("sent", st.membership.sent), ("received", st.membership.received)):
            for kind, count in sorted(tally.items()):
                msgs.add_metric((direction, str(kind)), count)
        yield msgs
        rejected = CounterMetricFamily(
            "hydra_gossip_messages_rejected", "Membership messages rejected", labels=("reason",)
        )
        for reason, count in sorted(st.membership.rejected.items()):
            rejected.add_metric((str(reason),), count)
        yield rejected
        peers = GaugeMetricFamily("hydra_peers", "Known peers by membership state", labels=("state",))
        states = _Tally(p.state for p in st.membership.peers)
        for state in sorted(set(states) | {"alive", "suspect", "dead"}):
            peers.add_metric((state,), states.get(state, 0))
        yield peers
        links = list(self.sources.links())
        yield GaugeMetricFamily("hydra_links", "Open peer links", value=len(links))
        frames = CounterMetricFamily(
            "hydra_link_frames_rejected",
            "Frames rejected on the open peer links by reason (a closed link's count leaves with it)",
            labels=("reason",),
        )
        frame_tally: _Tally[str] = _Tally()
        for link in links:
            frame_tally.update(link.rejected)
        for reason, count in sorted(frame_tally.items()):
            frames.add_metric((str(reason),), count)
        yield frames


def _prompt_cache(runners: list) -> Iterator:
    """The prompt cache's tiers per model (docs/prompt-cache.md), from the runners' engine figures."""
    hits = CounterMetricFamily(
        "hydra_prompt_cache_hits", "Admissions restored from a prompt cache tier", labels=("model", "tier")
    )
    misses = CounterMetricFamily(
        "hydra_prompt_cache_misses", "Admissions the prompt cache held nothing better for", labels=("model",)
    )
    restored = CounterMetricFamily(
        "hydra_prompt_cache_restored_tokens", "Prompt tokens restored instead of prefilled", labels=("model",)
    )
    size = GaugeMetricFamily("hydra_prompt_cache_bytes", "Bytes of saved KV states per tier", labels=("model", "tier"))
    entries = GaugeMetricFamily("hydra_prompt_cache_entries", "Saved KV states per tier", labels=("model", "tier"))
    failures = CounterMetricFamily(
        "hydra_prompt_cache_failures",
        "States not saved, written or restored, and disk files removed as invalid",
        labels=("model",),
    )
    for r in runners:
        e = r.engine
        hits.add_metric((r.model, "ram"), e.prompt_cache_hits_ram)
        hits.add_metric((r.model, "disk"), e.prompt_cache_hits_disk)
        misses.add_metric((r.model,), e.prompt_cache_misses)
        restored.add_metric((r.model,), e.prompt_cache_restored_tokens)
        size.add_metric((r.model, "ram"), e.prompt_cache_ram_bytes)
        size.add_metric((r.model, "disk"), e.prompt_cache_disk_bytes)
        entries.add_metric((r.model, "ram"), e.prompt_cache_ram_entries)
        entries.add_metric((r.model, "disk"), e.prompt_cache_disk_entries)
        failures.add_metric((r.model,), e.prompt_cache_failures)
    yield from (hits, misses, restored, size, entries, failures)
