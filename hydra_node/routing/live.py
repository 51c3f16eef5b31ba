"""The scheduler wired into a running node: the trio layer around the pure routing cores.

``LiveScheduling`` is what the router asks for an order of targets, and what it reports every
attempt to. It owns the node's ``TelemetryStore`` and ``Scheduler`` and feeds them from:

* every routed request (``attempt``): the router-measured TTFT and completion time, the host's
  reported queue wait, prompt, cached and completion tokens; failures only when the target is to
  blame (HTTP status >= 500: unavailable, lost, crashed);
* link pings: each linked peer's ``PeerLink.rtt_ms``, sampled every ``SAMPLE_INTERVAL_S`` and
  recorded whenever a new pong changed it, for every model the peer announces;
* gossip: a compact integer-only summary of our own measurements rides in our announcement's
  ``extra`` (``announce_extra``), and the summaries peers announce are merged as advisory hints.

Mode ``off`` routes the router's fixed rule (local first, then lowest queue, then RTT), ``shadow``
routes that rule too and records where the scheduler would have sent the request, ``active``
routes the scheduler's choice. See docs/scheduler.md ("Live wiring").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Protocol

import trio

from hydra_node.inference import Finished, GenerationError, GenerationEvent, GenerationRequest
from hydra_node.routing._affinity import CHARS_PER_TOKEN, request_features
from hydra_node.routing.scheduler_config import SchedulerConfig, SchedulerMode
from hydra_node.routing._hints import InvalidHint
from hydra_node.routing._score import Candidate, RequestFeatures
from hydra_node.routing.scheduler import Decision, Scheduler
from hydra_node.routing.target import RouteTarget
from hydra_node.routing.telemetry import LOCAL, MAX_MODELS_PER_NODE, MAX_TARGETS, Target, TelemetryStore

log = logging.getLogger("hydra.routing")

#: How often link RTTs are sampled and peers' announced summaries looked at (cheap: dict walks).
SAMPLE_INTERVAL_S = 0.5
#: Our announced telemetry summary is rebuilt at most this often, and only while it has fresh
#: entries: each rebuild is a new announcement that gossip spreads, so this bounds that traffic.
ANNOUNCE_REFRESH_S = 2.0
#: Summary entries put in our announcement. An announcement's ``extra`` holds at most 256 items
#: (hydra_node/mesh/membership/announcement.py) and an entry is at most 13; 8 entries stay < 110.
ANNOUNCED_ENTRIES = 8
#: Key of the summary in the announcement's ``extra``.
ANNOUNCE_KEY = "tm"
#: Context length assumed for a candidate: the router does not know a host's n_ctx, and a prompt
#: that does not fit is refused by the host itself (HTTP 400, not counted as the host's failure).
ASSUMED_CONTEXT_TOKENS = 1 << 30
#: Statuses that blame the target (unavailable, lost, crashed, bad frames); 4xx never do.
BLAME_STATUS_MIN = 500


@dataclass(frozen=True)
class RequestObservation:
    """One finished attempt as the router saw it (passed to ``LiveScheduling.listeners``)."""

    target: Target
    ttft_ms: float
    duration_ms: float
    itl_ms: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class SchedulingStatistics:
    """The live scheduler's counters, for ``/metrics``."""

    mode: SchedulerMode
    #: The scheduler's decision counters (decisions, overrides, shadow_disagreements, ...).
    decisions: Mapping[str, int]
    #: ``LiveScheduling.counters``: attempts, failures (blamed or not), RTT samples, hint summaries.
    counters: Mapping[str, int]
    #: Targets with measured telemetry.
    tracked_targets: int


class MeshView(Protocol):
    """What :meth:`LiveScheduling.sample` reads of the mesh (``MeshService`` satisfies it)."""

    def members(self) -> Mapping[str, Any]: ...

    def open_links(self) -> Sequence[Any]: ...


def _finite(value: float, low: float, high: float) -> float:
    """Clamp a number reported by a host (possibly a peer: untrusted) into [low, high]."""
    return low if not isinstance(value, (int, float)) or not math.isfinite(value) else min(high, max(low, value))


class LiveScheduling:
    """Scheduler + telemetry of one node. The router calls ``order`` and ``attempt``."""

    def __init__(self, config: SchedulerConfig, node_id: str) -> None:
        self.config = config
        self.node_id = node_id
        self.telemetry = TelemetryStore(stale_after_secs=config.stale_after_ms / 1000.0, local_node_id=node_id)
        self.scheduler = Scheduler(config, self.telemetry)
        self.in_flight: dict[Target, int] = {}  # our outstanding attempts; a key is dropped at 0
        self.listeners: list[Callable[[RequestObservation], None]] = []
        self.counters = {
            "attempts": 0,
            "finished": 0,
            "failures_blamed": 0,
            "failures_not_blamed": 0,
            "rtt_samples": 0,
            "hint_summaries_merged": 0,
            "hint_entries_merged": 0,
            "hint_summaries_rejected": 0,
            "announced_summaries": 0,
            "observations_dropped": 0,
        }
        self._last_rtt: dict[str, float] = {}  # peer -> last RTT recorded (pruned to current links)
        self._hint_seen: dict[str, tuple[int, int]] = {}  # peer -> (incarnation, seq) merged
        self._announced: tuple[float, dict] | None = None
        #: Our attempts at a remote target that ended since its host's last announcement arrived:
        #: the announced queue depth still counts them (announcements lag by up to a gossip round).
        self._ended_since_announce: dict[Target, int] = {}

    @property
    def mode(self) -> SchedulerMode:
        return self.config.mode

    # ---- routing ---------------------------------------------------------------------------
    @staticmethod
    def target_of(rt: RouteTarget) -> Target | None:
        """The telemetry key of a router target; None if its ids are out of bounds."""
        try:
            return Target(LOCAL if rt.local else rt.node_id, rt.model)
        except ValueError:
            return None

    def features(self, req: GenerationRequest) -> RequestFeatures:
        if req.kind == "chat":
            body: dict = {"messages": [{"role": m.role, "content": m.content} for m in req.messages]}
            chars = sum(len(m.content) for m in req.messages)
            chars += sum(len(t.description) + len(t.parameters) for t in req.tools)  # rendered into the prompt
        else:
            body = {"prompt": req.prompt}
            chars = len(req.prompt)
        if req.max_tokens is not None:
            body["max_tokens"] = req.max_tokens
        tokens = len(req.prompt_tokens) or chars // CHARS_PER_TOKEN + 1  # a token prompt is counted exactly
        return request_features(body, req.model, tokens, self.config, session_header=req.session or None)

    def order(self, ready: list[RouteTarget], req: GenerationRequest) -> tuple[list[RouteTarget], Decision | None]:
        """Order ``ready`` (router targets, sorted by the fixed rule) for this request.

        The first is where the request goes; the rest are the retry order (the scheduler's ranking
        in active mode, the fixed rule otherwise). Returns the decision too (None if not decided).
        """
        if not ready:
            return ready, None
        maybe_keys = [self.target_of(t) for t in ready]
        keys = [k for k in maybe_keys if k is not None]
        if len(keys) < len(maybe_keys):
            return ready, None  # ids the telemetry cannot key: keep the fixed rule
        by_key = dict(zip(keys, ready))
        candidates = []
        for key, rt in zip(keys, ready):
            announced = max(0, int(rt.queue_depth))  # local: live; remote: as last announced
            if not key.is_local:
                announced = max(0, announced - self._ended_since_announce.get(key, 0))
            load = max(self.in_flight.get(key, 0), announced)
            # a host with free slots is not busy: requests run side by side in its engine
            slots = max(1, rt.slots)
            candidates.append(
                Candidate(
                    target=key,
                    context_length=ASSUMED_CONTEXT_TOKENS,
                    in_flight=load,
                    queue_depth=max(0, load - slots),
                    slots=slots,
                )
            )
        decision = self.scheduler.decide(candidates, self.features(req), trio.current_time(), baseline=keys[0])
        if decision.target is None or decision.target not in by_key:
            return ready, decision
        first = by_key[decision.target]
        rest = (
            [by_key[s.target] for s in decision.scores if s.target in by_key]
            if self.mode is SchedulerMode.ACTIVE
            else ready
        )
        return [first] + [t for t in rest if t is not first], decision

    @asynccontextmanager
    async def attempt(self, rt: RouteTarget, req: GenerationRequest) -> AsyncIterator[AsyncIterator[GenerationEvent]]:
        """``rt.open(req)``, measured: feeds telemetry and listeners when it finishes or fails."""
        key = self.target_of(rt)
        started = trio.current_time()
        first_at: list[float] = []
        self.counters["attempts"] += 1
        if key is not None:
            self.in_flight[key] = self.in_flight.get(key, 0) + 1
        try:
            async with rt.open(req) as events:
                yield self._watch(key, events, started, first_at)
        except GenerationError as exc:
            self._failed(key, exc, started)
            raise
        finally:
            if key is not None:
                if not key.is_local and len(self._ended_since_announce) < MAX_TARGETS:
                    self._ended_since_announce[key] = self._ended_since_announce.get(key, 0) + 1
                left = self.in_flight.get(key, 1) - 1
                if left > 0:
                    self.in_flight[key] = left
                else:
                    self.in_flight.pop(key, None)

    async def _watch(
        self, key: Target | None, events: AsyncIterator[GenerationEvent], started: float, first_at: list[float]
    ) -> AsyncIterator[GenerationEvent]:
        async for ev in events:
            now = trio.current_time()
            if not first_at:
                first_at.append(now)
            if isinstance(ev, Finished) and key is not None:
                self._finished(key, ev, started, first_at[0], now)
            yield ev

    def _finished(self, key: Target, fin: Finished, started: float, first_at: float, now: float) -> None:
        self.counters["finished"] += 1
        duration_ms = max(0.0, (now - started) * 1000.0)
        ttft_ms = min(duration_ms, max(0.0, (first_at - started) * 1000.0))
        prompt = int(_finite(fin.prompt_tokens, 0, 1 << 31))
        completion = int(_finite(fin.completion_tokens, 0, 1 << 31))
        cached = int(_finite(fin.cached_tokens, 0, prompt))
        queue_ms = _finite(fin.queue_wait_ms, 0.0, ttft_ms)
        self.telemetry.observe_request(
            key,
            now,
            queue_wait_ms=queue_ms,
            ttft_ms=ttft_ms,
            duration_ms=duration_ms,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
        )
        itl = _finite(fin.itl_ms, 0.0, duration_ms)
        if itl == 0.0 and completion > 1:
            itl = (duration_ms - ttft_ms) / (completion - 1)
        obs = RequestObservation(key, ttft_ms, duration_ms, itl, prompt, completion, cached)
        for listener in self.listeners:
            listener(obs)

    def _failed(self, key: Target | None, exc: GenerationError, started: float) -> None:
        if key is None:
            return
        if exc.status >= BLAME_STATUS_MIN:
            self.counters["failures_blamed"] += 1
            now = trio.current_time()
            self.telemetry.observe_failure(key, now, max(0.0, (now - started) * 1000.0))
        else:  # context overflow, busy (429), cancelled, bad request: not the target's fault
            self.counters["failures_not_blamed"] += 1

    # ---- links and gossip ------------------------------------------------------------------
    async def run(self, mesh: MeshView, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample link RTTs and merge peers' announced summaries until cancelled."""
        task_status.started()
        while True:
            self.sample(mesh, trio.current_time())
            await trio.sleep(SAMPLE_INTERVAL_S)

    def sample(self, mesh: MeshView, now: float) -> None:
        members = mesh.members()
        links = {link.peer_id: link for link in mesh.open_links()}
        for peer_id in [p for p in self._last_rtt if p not in links]:
            del self._last_rtt[peer_id]
        for peer_id, link in links.items():
            rtt, ann = link.rtt_ms, members.get(peer_id)
            if rtt is None or ann is None or self._last_rtt.get(peer_id) == rtt:
                continue
            self._last_rtt[peer_id] = rtt
            for model in ann.models[:MAX_MODELS_PER_NODE]:
                try:
                    target = Target(peer_id, model.id)
                except ValueError:
                    continue
                self.telemetry.observe_probe(target, rtt, now)
                self.counters["rtt_samples"] += 1
        for peer_id in [p for p in self._hint_seen if p not in members]:
            del self._hint_seen[peer_id]
        for key in [k for k in self._ended_since_announce if k.node not in members]:
            del self._ended_since_announce[key]
        for peer_id, ann in members.items():
            if ann is not None:
                self._merge(peer_id, ann, now)

    def _merge(self, peer_id: str, ann, now: float) -> None:
        version = (ann.incarnation, ann.seq)
        if self._hint_seen.get(peer_id) == version:
            return
        self._hint_seen[peer_id] = version
        for key in [k for k in self._ended_since_announce if k.node == peer_id]:
            del self._ended_since_announce[key]  # its new queue depth no longer counts them
        summary = ann.extra.get(ANNOUNCE_KEY) if isinstance(ann.extra, Mapping) else None
        if summary is None:
            return
        try:
            kept = self.telemetry.merge_hint(peer_id, summary, now)
        except InvalidHint as exc:  # the peer's fault: drop the summary, keep everything else
            self.counters["hint_summaries_rejected"] += 1
            log.warning("event=telemetry_hint_rejected peer=%s reason=%r", peer_id[:16], str(exc))
            return
        self.counters["hint_summaries_merged"] += 1
        self.counters["hint_entries_merged"] += kept

    def announce_extra(self) -> dict:
        """``{"tm": summary}`` for our announcement (``{}`` when we have nothing fresh)."""
        now = trio.current_time()
        if self._announced is not None and (
            now - self._announced[0] < ANNOUNCE_REFRESH_S or not self._announced[1] and not self.telemetry.targets()
        ):
            return self._announced[1]
        summary = self.telemetry.summary(now)
        entries = summary["entries"][:ANNOUNCED_ENTRIES]
        extra = {ANNOUNCE_KEY: {"v": summary["v"], "entries": entries}} if entries else {}
        if extra:
            self.counters["announced_summaries"] += 1
        self._announced = (now, extra)
        return extra

    # ---- what other services measured --------------------------------------------------------
    def observe_materialised(self, kind: str, name: str, source: str, nbytes: int, duration_s: float) -> None:
        """An artifact materialised here (docs/placement.md): bytes from a peer (``peer:<id>``) feed that
        peer's bandwidth estimate; model weights and layer packages are model ``name``'s cold start here."""
        now, ms = trio.current_time(), duration_s * 1000.0
        try:
            if source.startswith("peer:"):
                self.telemetry.observe_transfer(Target(source.removeprefix("peer:"), name), nbytes, ms, now)
            if kind in ("model_weights", "layer_package"):
                self.telemetry.observe_artifact(Target(LOCAL, name), ms, now)
        except ValueError:  # an id the telemetry cannot key
            self.counters["observations_dropped"] += 1

    def observe_kv(self, model: str, direction: str, nbytes: int, duration_ms: float) -> None:
        """A KV state exported or imported by our runner of ``model`` (docs/kv-reuse.md): its transfer cost."""
        try:
            self.telemetry.observe_kv_transfer(Target(LOCAL, model), duration_ms, trio.current_time(), nbytes=nbytes)
        except ValueError:
            self.counters["observations_dropped"] += 1

    # ---- status ----------------------------------------------------------------------------
    def statistics(self) -> SchedulingStatistics:
        return SchedulingStatistics(
            mode=self.mode,
            decisions=dict(self.scheduler.state.counters),
            counters=dict(self.counters),
            tracked_targets=len(self.telemetry),
        )

    def network_costs(self) -> dict:
        snap = self.telemetry.snapshot(trio.current_time())
        snap["counters"] = dict(self.counters)
        return snap

    def status(self) -> dict:
        st = self.scheduler.status()
        st["in_flight"] = {k.label(): v for k, v in sorted(self.in_flight.items())}
        return st
