"""Picks where a generation runs: a local runner or (with the mesh) a remote host.

The fixed rule (scheduler mode ``off``, and what ``shadow`` routes) is: local runner
if this node hosts the model, else the remote host with the lowest queue, then the
lowest RTT.  With ``scheduling`` (hydra_node/routing/live.py) the scheduler orders
the targets in mode ``active`` and every attempt feeds its telemetry.  A failure
before the first event retries once on the next target (a peer that was unreachable or does not
host the model passes it on without using that retry); one after it that another host can
absorb (its host died, its runner was killed) continues the same generation on another ready
target of the same model identity, up to ``max_continuations`` times
(:mod:`hydra_node.routing.continuation`; docs/scheduler.md "Continuing a stream"). A request or a
continuation that finds no routable target while its model is expected back (a runner loading or
restarting, a re-host claimed or pending, a host that just died) waits up to ``target_wait_s`` for
one (:mod:`hydra_node.routing.target_wait`; docs/scheduler.md "Waiting for a target").  Embeddings (:meth:`Router.embed`) go to
the first target of the fixed rule that can embed (the scheduler ignores them), retried the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

import trio

from hydra_node.eventlog import EmitFn, RateGate
from hydra_node.routing.continuation import CONTINUABLE_CODES, DEFAULT_MAX_CONTINUATIONS, Continuation
from hydra_node.inference import (
    EmbeddingRequest,
    EmbeddingResult,
    GenerationError,
    GenerationEvent,
    GenerationRequest,
    Finished,
    ModelCaps,
    ModelUnavailable,
    NO_CAPS,
    TokenizeRequest,
    TokenizeResult,
)
from hydra_node.routing.capable import capability_refusal, needed, serves
from hydra_node.routing.route_events import DECISION_INTERVAL_S, RequestReport, decision_fields
from hydra_node.routing.target import EmbedFn, OpenGeneration, RouteTarget, TargetSource, TargetState
from hydra_node.routing.target_wait import MeshView, Routable, WaitOutcome, expected_back, wait_step

if TYPE_CHECKING:
    from hydra_node.routing.live import LiveScheduling

__all__ = [
    "EmbedFn",
    "MeshViewSource",
    "ModelListing",
    "OpenGeneration",
    "RouteTarget",
    "RoutedEvents",
    "Router",
    "RouterStatistics",
    "TargetSource",
    "TargetState",
    "UnknownModel",
]

log = logging.getLogger("hydra.router")

#: Models whose hosts all vanished are answered with 503 (not 404) for this long.
REMEMBER_MODELS_S = 600.0
MAX_REMEMBERED_MODELS = 1024
#: How often a request waiting for a target looks again (docs/scheduler.md "Waiting for a target").
TARGET_WAIT_POLL_S = 0.25
#: Failure codes after which the same host may take the continuation once its runner is ready again
#: (the runner restarted; the host is fine): only a local one, whose state is exact.
RESTART_CODES = frozenset({"runner_killed", "split_worker_lost"})
_UNAVAILABLE = frozenset({"model_unavailable"})


@runtime_checkable
class MeshViewSource(Protocol):
    """A target source that also says what the mesh announces about models coming back
    (:class:`hydra_node.routing.remote.RemoteGeneration`)."""

    def mesh_view(self) -> MeshView: ...


class UnknownModel(GenerationError):
    def __init__(self, model: str, known: list[str]):
        hint = f"; available: {', '.join(sorted(known))}" if known else "; no models are available"
        super().__init__(f"model {model!r} does not exist in this mesh{hint}", code="model_not_found", status=404)


@dataclass(frozen=True)
class RouterStatistics:
    """Requests retried on a second target, requests that found no ready target, generations
    continued on another target after their host failed mid-stream (``continuations``: parts
    started), and failures mid-stream that could not be continued (``continuation_failures``:
    no target of the same model identity, the budget spent, or the continuation failed too)."""

    retries: int
    no_target: int
    continuations: int = 0
    continuation_failures: int = 0
    #: Requests (new or continuations) that waited for a target, by how the wait ended
    #: (:class:`hydra_node.routing.target_wait.WaitOutcome`).
    target_waits: dict[str, int] = field(default_factory=dict)


@dataclass
class ModelListing:
    """One model of :meth:`Router.models`: the nodes hosting it and each one's state there
    (a :class:`hydra_node.api.router_api.ModelEntry`)."""

    id: str
    hosts: list[str] = field(default_factory=list)
    states: dict[str, TargetState] = field(default_factory=dict)
    #: What the model can do, as :meth:`Router.capabilities` says (``/v1/models`` may show it).
    caps: ModelCaps = NO_CAPS


class Router:
    def __init__(
        self,
        node_id: str,
        scheduling: LiveScheduling | None = None,
        on_event: EmitFn | None = None,
        *,
        max_continuations: int = DEFAULT_MAX_CONTINUATIONS,
        target_wait_s: float = 0.0,
    ):
        self.node_id = node_id
        #: Continuations per generation after a mid-stream failure (``[scheduler].max_continuations``; 0: none).
        self.max_continuations = max_continuations
        #: How long a request waits for a target of a model expected back (``[scheduler].target_wait_s``;
        #: 0: not at all — the node passes the config's, default 60).
        self.target_wait_s = target_wait_s
        #: Live events (route_events.py): every generation's ``request.finished``, sampled ``route.decision``s.
        self.on_event = on_event
        self._decisions = RateGate(DECISION_INTERVAL_S)
        #: Orders the targets (mode off/shadow/active) and measures every attempt; None keeps the
        #: fixed rule below, unmeasured.
        self.scheduling = scheduling
        self._sources: list[TargetSource] = []
        self._seen: dict[str, float] = {}  # model id -> last time a target for it existed (monotonic)
        self.retries = 0
        self.no_target = 0
        self.continuations = 0
        self.continuation_failures = 0
        self.target_waits: dict[str, int] = {o.value: 0 for o in WaitOutcome}
        self._routable: dict[str, Routable] = {}  # model id -> its last routable target (trio clock)
        self._own_parts: dict[tuple[str, str], int] = {}  # (node, model) -> parts this router has open there

    def add_source(self, source: TargetSource) -> None:
        self._sources.append(source)

    def statistics(self) -> RouterStatistics:
        return RouterStatistics(
            retries=self.retries,
            no_target=self.no_target,
            continuations=self.continuations,
            continuation_failures=self.continuation_failures,
            target_waits=dict(self.target_waits),
        )

    def all_targets(self) -> list[RouteTarget]:
        out: list[RouteTarget] = []
        for s in self._sources:
            out.extend(s.targets())
        return out

    def models(self) -> list[ModelListing]:
        by_id: dict[str, ModelListing] = {}
        ready: dict[str, list[RouteTarget]] = {}
        per_model: dict[str, list[RouteTarget]] = {}
        now = time.monotonic()
        targets = self.all_targets()
        for t in targets:
            if t.model not in self._seen and len(self._seen) >= MAX_REMEMBERED_MODELS:
                self._seen.pop(min(self._seen, key=self._seen.__getitem__))
            self._seen[t.model] = now
            m = by_id.setdefault(t.model, ModelListing(t.model))
            m.hosts.append(t.node_id)
            m.states[t.node_id] = t.state
            per_model.setdefault(t.model, []).append(t)
            if t.state == TargetState.READY:
                ready.setdefault(t.model, []).append(t)
        for m in by_id.values():
            m.caps = _caps_of(per_model[m.id])
        try:
            clock: float | None = trio.current_time()
        except RuntimeError:  # listed outside trio (a test, a tool): nothing to record
            clock = None
        if clock is not None:
            for m in by_id.values():
                self._note_routable(m.id, ready.get(m.id, []), clock)
        return sorted(by_id.values(), key=lambda m: m.id)

    def mesh_view(self) -> MeshView:
        """What the sources that know the mesh say about models coming back (alive members'
        announcement extras, the peers that left cleanly)."""
        extras: list[Any] = []
        left: set[str] = set()
        for s in self._sources:
            if isinstance(s, MeshViewSource):
                view = s.mesh_view()
                extras.extend(view.extras)
                left |= view.left
        return MeshView(tuple(extras), frozenset(left))

    def _note_routable(self, model: str, targets: list[RouteTarget], now: float) -> None:
        """``model`` has the routable ``targets`` at ``now`` (nothing recorded if none)."""
        if not targets:
            return
        if model not in self._routable and len(self._routable) >= MAX_REMEMBERED_MODELS:
            self._routable.pop(min(self._routable, key=lambda k: self._routable[k].at))
        hosts = frozenset(t.node_id for t in targets)
        self._routable[model] = Routable(now, hosts, frozenset(t.node_id for t in targets if t.local))

    def _expected(self, model: str, listed: list[RouteTarget]) -> str | None:
        """Why ``model`` is expected back for a request that may use the targets ``listed``."""
        return expected_back(
            model,
            listed,
            self.mesh_view(),
            last_routable=self._routable.get(model),
            now=trio.current_time(),
            wait_s=self.target_wait_s,
        )

    def _lookup(self, model: str, req: GenerationRequest | None = None) -> tuple[list[RouteTarget], list[RouteTarget]]:
        """``model``'s ready targets in the fixed rule's order, and all its targets; with ``req``, only
        those that may take it (a capability it needs: routing/capable.py)."""
        listed = [t for t in self.all_targets() if t.model == model and (req is None or serves(t.caps, req))]
        ready = sorted((t for t in listed if t.state == TargetState.READY), key=self._rank)
        return ready, listed

    async def _wait_for_target(
        self,
        model: str,
        look: Callable[[], tuple[list[RouteTarget], list[RouteTarget]]],
        *,
        continuation: bool,
        announce: bool = True,
    ) -> tuple[list[RouteTarget], str | None, WaitOutcome | None, float]:
        """Wait up to ``target_wait_s`` for ``look()`` to find a ready target while ``model`` is
        expected back: (the ready targets, why it was expected back, how the wait ended, seconds
        waited); no wait (outcome None) when it is not expected back or waiting is off. Nothing is
        sent to the client meanwhile; its going away cancels the wait. ``announce``: emit
        ``request.waiting`` (once per request: not when an earlier wait of it did)."""
        ready, listed = look()
        if ready or self.target_wait_s <= 0:
            return ready, None, None, 0.0
        why = self._expected(model, listed)
        if why is None:
            return [], None, None, 0.0
        start = trio.current_time()
        log.info("event=request_waiting model=%s why=%r wait_s=%g", model, why, self.target_wait_s)
        if self.on_event is not None and announce:
            self.on_event(
                "request.waiting",
                {"model": model, "why": why, "wait_s": self.target_wait_s, "continuation": continuation},
            )
        outcome = WaitOutcome.CLIENT_GONE
        try:
            while True:
                await trio.sleep(TARGET_WAIT_POLL_S)
                ready, listed = look()
                step = wait_step(
                    routable=bool(ready),
                    expected=None if ready else self._expected(model, listed),
                    waited_s=trio.current_time() - start,
                    wait_s=self.target_wait_s,
                )
                if step is not None:
                    outcome = step
                    return ready, why, outcome, trio.current_time() - start
        finally:
            self.target_waits[outcome.value] += 1
            log.info(
                "event=request_waited model=%s outcome=%s waited_s=%.1f",
                model,
                outcome.value,
                trio.current_time() - start,
            )

    def _no_target(
        self, model: str, listed: list[RouteTarget], why: str | None, outcome: WaitOutcome | None, waited_s: float
    ) -> GenerationError:
        """The 503 of a request that found no target (a 404 for a model never seen), naming the wait."""
        key = "[scheduler].target_wait_s"
        if not listed and why is None:
            known = [m.id for m in self.models()]
            if not self.recently_seen(model):
                return UnknownModel(model, known)
        self.no_target += 1
        if listed:
            states = {t.node_id: t.state.value for t in listed}
            head = f"no host can serve {model!r} right now (states: {states})"
        else:
            head = f"no host for {model!r} is reachable right now; its hosts left the mesh"
        if self.target_wait_s <= 0:
            tail = f"; the request did not wait for one ({key} = 0)"
        elif outcome is None:
            tail = f"; nothing says it is coming back, so the request did not wait for one ({key} = {self.target_wait_s:g})"
        elif outcome is WaitOutcome.TIMED_OUT:
            tail = f"; waited {self.target_wait_s:g} s for one ({key}) since {why}"
        else:
            tail = (
                f"; waited {waited_s:.1f} s for one, then it stopped being expected back "
                f"({key} = {self.target_wait_s:g})"
            )
        return ModelUnavailable(head + tail)

    def recently_seen(self, model: str) -> bool:
        """True if some host offered ``model`` within REMEMBER_MODELS_S (its hosts are gone: 503, not 404)."""
        t = self._seen.get(model)
        return t is not None and time.monotonic() - t < REMEMBER_MODELS_S

    def candidates(self, model: str) -> list[RouteTarget]:
        ts = [t for t in self.all_targets() if t.model == model]
        if not ts:
            known = [m.id for m in self.models()]
            if self.recently_seen(model):
                self.no_target += 1
                raise ModelUnavailable(f"no host for {model!r} is reachable right now; its hosts left the mesh")
            raise UnknownModel(model, known)
        return sorted((t for t in ts if t.state == TargetState.READY), key=_fixed_rule)

    @asynccontextmanager
    async def generate(self, req: GenerationRequest) -> AsyncIterator[RoutedEvents[GenerationEvent]]:
        """Open a generation on the best target; retry once elsewhere if it fails before any event.
        However it ends, ``request.finished`` reports it (``on_event``)."""
        report = RequestReport(req.model, trio.current_time())
        try:
            async with self._generate(req, report) as events:
                yield events
        except Exception:
            report.failed = True
            raise
        finally:
            if self.on_event is not None:
                self.on_event("request.finished", report.fields(trio.current_time()))

    @asynccontextmanager
    async def _generate(
        self, req: GenerationRequest, report: RequestReport
    ) -> AsyncIterator[RoutedEvents[GenerationEvent]]:
        if needed(req):  # a plain request needs nothing: no extra scan of the targets
            refused = capability_refusal(req, [t for t in self.all_targets() if t.model == req.model])
            if refused is not None:  # no target reports what the request needs (an older one would ignore it)
                raise refused
        candidates, listed = self._lookup(req.model, req)
        announced = False  # request.waiting emitted for this request
        if not candidates:
            candidates, why, outcome, waited = await self._wait_for_target(
                req.model, lambda: self._lookup(req.model, req), continuation=False
            )
            announced = outcome is not None
            if not candidates:
                raise self._no_target(req.model, self._lookup(req.model, req)[1] or listed, why, outcome, waited)
        self._note_routable(req.model, candidates, trio.current_time())
        decision = None
        if self.scheduling is not None:
            candidates, decision = self.scheduling.order(candidates, req)
        if self.on_event is not None and self._decisions.allow(trio.current_time()):
            self.on_event("route.decision", decision_fields(req.model, self.node_id, candidates, decision))
        open_target: Callable[
            [RouteTarget, GenerationRequest], AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]
        ]
        open_target = self.scheduling.attempt if self.scheduling is not None else _open
        # attempt: the one retry used; a peer that was unreachable or does not host the model (503
        # model_unavailable before anything ran there) passes to the next target without using it
        attempt, at = 0, 0
        target = candidates[0]
        unreachable: set[str] = set()  # peers this request could not reach
        unlinked: set[str] = set()  # of those, the ones without a link then: they may be linked soon
        waited_again = False  # the one wait after a failure before the first event
        while True:
            yielded = False
            try:
                part = self._part(target, open_target(target, req))
                async with part as events:
                    first = await _first_event(events)
                    yielded = True
                    report.served_by(target.node_id)
                    if first is not None:
                        report.saw(first, trio.current_time())
                    progress = Continuation(req, self.max_continuations)
                    progress.waiting_announced = announced
                    progress.start_part(target.node_id)
                    routed = RoutedEvents(
                        self._chain(first, events, part, report, progress, target, open_target), target.node_id
                    )
                    routed.progress = progress
                    yield routed
                    return
            except GenerationError as exc:
                unreached = exc.code == "model_unavailable" and not target.local
                if unreached:
                    unreachable.add(target.node_id)
                    if not target.linked:
                        unlinked.add(target.node_id)
                if not exc.retry_elsewhere or yielded or (attempt and not unreached):
                    raise
                if at + 1 < len(candidates):
                    at += 1
                    target = candidates[at]
                elif not waited_again and (unreached or (target.local and exc.code in RESTART_CODES | _UNAVAILABLE)):
                    # nothing left to try: this node's runner died (or began restarting) before the first
                    # event, or no peer could be reached (one that just died is still listed): wait for
                    # a target, one of a peer this request could not reach aside
                    waited_again = True
                    skip, back = frozenset(unreachable), frozenset(unlinked)

                    def look(
                        skip: frozenset[str] = skip, back: frozenset[str] = back
                    ) -> tuple[list[RouteTarget], list[RouteTarget]]:
                        """Ready targets, less the peers this request could not reach, unless one had no
                        link then and has one now (a relayed link comes up after the peer is listed)."""
                        ready, listed = self._lookup(req.model, req)
                        ok = [t for t in ready if t.local or t.node_id not in skip or (t.node_id in back and t.linked)]
                        return ok, listed

                    found, _, outcome, _ = await self._wait_for_target(
                        req.model, look, continuation=False, announce=not announced
                    )
                    announced = announced or outcome is not None
                    if not found:
                        raise
                    target = found[0]
                else:
                    raise
                attempt = attempt if unreached else 1
                self.retries += 1
                log.info("event=route_retry model=%s target=%s after=%r", req.model, target.key, exc)

    async def _chain(
        self,
        first: GenerationEvent | None,
        events: AsyncIterator[GenerationEvent],
        part: _Part,
        report: RequestReport,
        progress: Continuation,
        target: RouteTarget,
        open_target: Callable[
            [RouteTarget, GenerationRequest], AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]
        ],
    ) -> AsyncGenerator[GenerationEvent, None]:
        """The events of the first part, then of each continuation (opened here, on the first
        part's model identity, never on a host that failed this generation — unless its local runner
        restarted, then again there once it is ready)."""
        if first is None:
            return
        async with AsyncExitStack() as parts:  # the continuations' streams, closed when the answer is
            pending: GenerationEvent | None = first
            failed: dict[str, bool] = {}  # host -> may serve it again once ready (its local runner restarted)
            while True:
                try:
                    if pending is not None:  # the part's first event (the first part's: reported already)
                        ev, pending = pending, None
                        out = progress.relayed(ev)
                        if ev is not first or isinstance(out, Finished):
                            report.saw(out, trio.current_time())
                        yield out
                    async for ev in events:
                        out = progress.relayed(ev)
                        report.saw(out, trio.current_time())
                        yield out
                    return
                except GenerationError as exc:
                    exc.streamed = True  # too late to retry elsewhere: only a continuation goes on
                    failure = exc
                await part.fail(failure)  # closed now (its runner slot freed, its failure measured)
                self._failed_on(failed, progress.hosts[-1], failure)
                progress.failed_part()
                opened = await self._continue(progress, failure, target, failed, open_target, parts)
                if opened is None:
                    raise failure
                part, events, pending = opened
                report.served_by(progress.hosts[-1])

    async def _continue(
        self,
        progress: Continuation,
        failure: GenerationError,
        origin: RouteTarget,
        failed: dict[str, bool],
        open_target: Callable[
            [RouteTarget, GenerationRequest], AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]
        ],
        parts: AsyncExitStack,
    ) -> tuple[_Part, AsyncIterator[GenerationEvent], GenerationEvent | None] | None:
        """Open the continuation of a generation that ``failure`` cut: its events and the first one
        (None: the failure stands — it may not continue, no target can take it, or every
        continuation the budget allows failed before its first event)."""
        while True:
            verdict = progress.decide(failure)
            if not verdict.continues:
                if progress.continuations or failure.code in CONTINUABLE_CODES:
                    self.continuation_failures += 1
                log.info("event=continuation_refused model=%s why=%r after=%r", origin.model, verdict.reason, failure)
                return None
            await trio.lowlevel.checkpoint_if_cancelled()  # the client went away: nothing continues
            target = None
            if origin.identity is not None:  # (a target of unknown identity never continues anything)
                # a ready target at once, else a wait if the model is expected back
                found, _, outcome, _ = await self._wait_for_target(
                    origin.model,
                    lambda: self._continuation_look(origin, failed, progress.request),
                    continuation=True,
                    announce=not progress.waiting_announced,
                )
                progress.waiting_announced = progress.waiting_announced or outcome is not None
                await trio.lowlevel.checkpoint_if_cancelled()
                target = found[0] if found else None
            if target is None:
                self.continuation_failures += 1
                log.info(
                    "event=continuation_refused model=%s why='no other ready target of its identity'", origin.model
                )
                return None
            req = progress.resume_request()
            self.continuations += 1
            progress.start_part(target.node_id)
            log.info(
                "event=request_continued model=%s target=%s at_tokens=%d after=%r",
                origin.model,
                target.key,
                len(req.resume_tokens),
                failure,
            )
            if self.on_event is not None:
                self.on_event(
                    "request.continued",
                    {
                        "model": origin.model,
                        "from": progress.hosts[-2],
                        "to": target.node_id,
                        "tokens": len(req.resume_tokens),
                        "continuation": progress.continuations,
                        "after": failure.code,
                    },
                )
            part = self._part(target, open_target(target, req))
            try:
                events = await part.__aenter__()
            except GenerationError as exc:
                failure = exc
            else:
                parts.push_async_exit(part)
                try:
                    return part, events, await _first_event(events)
                except GenerationError as exc:
                    await part.fail(exc)
                    failure = exc
            failure.streamed = True
            self._failed_on(failed, target.node_id, failure)
            progress.failed_part()

    def _failed_on(self, failed: dict[str, bool], host: str, failure: GenerationError) -> None:
        """``host`` failed this generation with ``failure``: it may serve it again only if that was
        this node's own runner restarting (the host is fine; its state is exact), never otherwise."""
        again = host == self.node_id and failure.code in RESTART_CODES
        failed[host] = again and failed.get(host, True)

    def _continuation_look(
        self, origin: RouteTarget, failed: dict[str, bool], req: GenerationRequest | None = None
    ) -> tuple[list[RouteTarget], list[RouteTarget]]:
        """The ready targets a continuation of ``origin`` may take, best first (a free one first:
        :meth:`_continuation_rank`), and every target of its model it may take once ready (of its
        identity, or of one unknown while it loads; on a host it has not failed on)."""
        if origin.identity is None:
            return [], []
        usable = [
            t
            for t in self.all_targets()
            if t.model == origin.model
            and (t.node_id not in failed or (failed[t.node_id] and t.local))
            and t.identity in (origin.identity, None)
            and (req is None or serves(t.caps, req))
        ]
        ready = sorted(
            (t for t in usable if t.state == TargetState.READY and t.identity == origin.identity),
            key=self._continuation_rank,
        )
        return ready, usable

    def _free_now(self, t: RouteTarget) -> int:
        """Slots ``t`` could start a sequence in now: a local runner's exact count; a peer's as it
        announced, less the parts this router has open there that it may not have announced yet."""
        if t.local and t.free_slots is not None:
            return t.free_slots
        own = self._own_parts.get((t.node_id, t.model), 0)
        used = t.slots - t.free_slots if t.free_slots is not None else t.queue_depth
        return t.slots - max(used, own)

    def _load(self, t: RouteTarget) -> float:
        """How loaded ``t`` is: its requests (as announced, or this router's own open parts there if
        more) per slot while it has a free one; once it has none, its requests (a peer's slots are
        estimated as its queue plus its free slots, so per slot every busy peer would look alike)."""
        requests = max(t.queue_depth, self._own_parts.get((t.node_id, t.model), 0))
        return requests / max(1, t.slots) if self._free_now(t) > 0 else float(requests)

    def _rank(self, t: RouteTarget) -> tuple:
        """A new request's order: the fixed rule (local first, a free slot, the shortest queue per
        slot, the nearest, the node id) with this router's own open parts counted at a peer — its
        announcement lags, so requests sent at once would all go to the first peer that announced
        a free slot and queue there."""
        return (not t.local, self._free_now(t) <= 0, self._load(t), t.rtt_ms, t.node_id)

    def _continuation_rank(self, t: RouteTarget) -> tuple:
        """A continuation's order: a target with a free slot first (one with none would queue the
        continuation behind its own streams: the client's stall), then the least loaded per slot
        counting this router's own open parts, local, the nearest, the node id."""
        return (self._free_now(t) <= 0, self._load(t), not t.local, t.rtt_ms, t.node_id)

    def _part(self, target: RouteTarget, cm: AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]) -> _Part:
        """A part on ``target``, counted in ``_own_parts`` while it is open."""
        key = (target.node_id, target.model)
        self._own_parts[key] = self._own_parts.get(key, 0) + 1

        def release() -> None:
            n = self._own_parts.get(key, 0) - 1
            if n > 0:
                self._own_parts[key] = n
            else:
                self._own_parts.pop(key, None)

        return _Part(cm, release)

    def capabilities(self, model: str) -> ModelCaps:
        """What ``model`` can do: this node's runner's report when it hosts it, else the first a host
        reports in the fixed rule's order (ready hosts first); :data:`NO_CAPS` when none reports any
        (no such model, or only older hosts). Every host of one model file reports the same, but
        ``vision``/``audio`` (a host's projector): the model has them when any of its hosts does."""
        return _caps_of([t for t in self.all_targets() if t.model == model])

    async def tokenize(self, req: TokenizeRequest) -> TokenizeResult:
        """Tokenize or detokenize on a host of ``req.model``: this node's runner when it hosts it, else
        the first peer of the fixed rule that can (the scheduler ignores these); a retryable failure is
        tried once more on the next target."""
        candidates = [(t, fn) for t in self.candidates(req.model) if (fn := t.tokenize) is not None]
        if not candidates:
            self.no_target += 1
            raise ModelUnavailable(
                f"no host can tokenize with {req.model!r} right now (its hosts are not ready, or run a "
                "hydra-node older than the tokenize stream)"
            )
        for attempt, (_, fn) in enumerate(candidates[:2]):
            try:
                return await fn(req)
            except GenerationError as exc:
                if not (exc.retry_elsewhere and attempt == 0 and len(candidates) > 1):
                    raise
                self.retries += 1
                log.info(
                    "event=route_retry kind=tokenize model=%s target=%s after=%r", req.model, candidates[1][0].key, exc
                )
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def embed(self, req: EmbeddingRequest) -> EmbeddingResult:
        """Embed on the first target of the fixed rule (the scheduler neither orders nor measures
        embeddings); a retryable failure is tried once more on the next target."""
        candidates = [(t, embed) for t in self.candidates(req.model) if (embed := t.embed) is not None]
        if not candidates:
            self.no_target += 1
            raise ModelUnavailable(f"no host can embed with {req.model!r} right now")
        for attempt, (_, embed) in enumerate(candidates[:2]):
            try:
                return await embed(req)
            except GenerationError as exc:
                if not (exc.retry_elsewhere and attempt == 0 and len(candidates) > 1):
                    raise
                self.retries += 1
                log.info(
                    "event=route_retry kind=embed model=%s target=%s after=%r", req.model, candidates[1][0].key, exc
                )
        raise AssertionError("unreachable: the last attempt returns or raises")


E = TypeVar("E")


class RoutedEvents(Generic[E]):
    """The events of a routed generation, and ``served_by``: the node generating them, known before
    the first event is read (an API can name it in its response headers, streams included)."""

    def __init__(self, events: AsyncGenerator[E, None], served_by: str):
        self._events = events
        self.served_by = served_by
        #: The router's record of the generation's parts (None: not a routed generation).
        self.progress: Continuation | None = None

    @property
    def served_by_all(self) -> tuple[str, ...]:
        """Every host that served a part of the answer, in order (the first is :attr:`served_by`;
        more than one after a continuation). Complete once the events are."""
        if self.progress is None:
            return (self.served_by,) if self.served_by else ()
        return self.progress.served_by_all

    def __aiter__(self) -> RoutedEvents[E]:
        return self

    async def __anext__(self) -> E:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()


async def _first_event(events: AsyncIterator[GenerationEvent]) -> GenerationEvent | None:
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        return None


def _caps_of(targets: list[RouteTarget]) -> ModelCaps:
    """The first capabilities reported among one model's ``targets``: local first, ready ones before
    the others, then the fixed rule's order; :data:`NO_CAPS` when none reports any. ``vision`` and
    ``audio`` come from the host's projector, not the model file: the model has them when any host
    reports them (the router sends a request with images to such a host)."""
    ranked = sorted(targets, key=lambda t: (not t.local, t.state != TargetState.READY, _fixed_rule(t)))
    reported = [t.caps for t in ranked if t.caps is not None]
    if not reported:
        return NO_CAPS
    vision, audio = any(c.vision for c in reported), any(c.audio for c in reported)
    first = reported[0]
    if (vision, audio) == (first.vision, first.audio):
        return first
    return dataclasses.replace(first, vision=vision, audio=audio)


def _fixed_rule(t: RouteTarget) -> tuple:
    """The fixed rule's order: local first, then a host with a free slot before a busy one, then the
    shortest queue per slot, the nearest, and the node id (deterministic)."""
    return (not t.local, t.busy, t.queue_depth / max(1, t.slots), t.rtt_ms, t.node_id)


class _Part:
    """One part's ``open_target`` context, closable once: early by :meth:`fail` when the part's
    stream failed (so its target sees the failure and frees what it holds at once), else when
    the routed generation ends."""

    def __init__(
        self,
        cm: AbstractAsyncContextManager[AsyncIterator[GenerationEvent]],
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._cm = cm
        self._open = False
        self._on_close = on_close  # once, when the part is closed (or failed to open)

    def _closed(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    async def __aenter__(self) -> AsyncIterator[GenerationEvent]:
        try:
            events = await self._cm.__aenter__()
        except BaseException:
            self._closed()
            raise
        self._open = True
        return events

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        if not self._open:
            self._closed()
            return False
        self._open = False
        try:
            return await self._cm.__aexit__(*exc_info)
        finally:
            self._closed()

    async def fail(self, exc: GenerationError) -> None:
        """Close the part with ``exc`` (what its stream raised); a failure its close raises is ``exc``'s."""
        try:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
        except GenerationError:
            pass


def _open(target: RouteTarget, req: GenerationRequest) -> AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]:
    """``target.open(req)``: an attempt unmeasured (no scheduling)."""
    return target.open(req)
