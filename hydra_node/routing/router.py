"""Picks where a generation runs: a local runner or (with the mesh) a remote host.

The fixed rule (scheduler mode ``off``, and what ``shadow`` routes) is: local runner
if this node hosts the model, else the remote host with the lowest queue, then the
lowest RTT.  With ``scheduling`` (hydra_node/routing/live.py) the scheduler orders
the targets in mode ``active`` and every attempt feeds its telemetry.  A failure
before the first event retries once on the next target; one after it that another host can
absorb (its host died, its runner was killed) continues the same generation on another ready
target of the same model identity, up to ``max_continuations`` times
(:mod:`hydra_node.routing.continuation`; docs/scheduler.md "Continuing a stream").  Embeddings (:meth:`Router.embed`) go to
the first target of the fixed rule that can embed (the scheduler ignores them), retried the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

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
    ModelUnavailable,
)
from hydra_node.routing.route_events import DECISION_INTERVAL_S, RequestReport, decision_fields
from hydra_node.routing.target import EmbedFn, OpenGeneration, RouteTarget, TargetSource, TargetState

if TYPE_CHECKING:
    from hydra_node.routing.live import LiveScheduling

__all__ = [
    "EmbedFn",
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


@dataclass
class ModelListing:
    """One model of :meth:`Router.models`: the nodes hosting it and each one's state there
    (a :class:`hydra_node.api.router_api.ModelEntry`)."""

    id: str
    hosts: list[str] = field(default_factory=list)
    states: dict[str, TargetState] = field(default_factory=dict)


class Router:
    def __init__(
        self,
        node_id: str,
        scheduling: LiveScheduling | None = None,
        on_event: EmitFn | None = None,
        *,
        max_continuations: int = DEFAULT_MAX_CONTINUATIONS,
    ):
        self.node_id = node_id
        #: Continuations per generation after a mid-stream failure (``[scheduler].max_continuations``; 0: none).
        self.max_continuations = max_continuations
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

    def add_source(self, source: TargetSource) -> None:
        self._sources.append(source)

    def statistics(self) -> RouterStatistics:
        return RouterStatistics(
            retries=self.retries,
            no_target=self.no_target,
            continuations=self.continuations,
            continuation_failures=self.continuation_failures,
        )

    def all_targets(self) -> list[RouteTarget]:
        out: list[RouteTarget] = []
        for s in self._sources:
            out.extend(s.targets())
        return out

    def models(self) -> list[ModelListing]:
        by_id: dict[str, ModelListing] = {}
        now = time.monotonic()
        for t in self.all_targets():
            if t.model not in self._seen and len(self._seen) >= MAX_REMEMBERED_MODELS:
                self._seen.pop(min(self._seen, key=self._seen.__getitem__))
            self._seen[t.model] = now
            m = by_id.setdefault(t.model, ModelListing(t.model))
            m.hosts.append(t.node_id)
            m.states[t.node_id] = t.state
        return sorted(by_id.values(), key=lambda m: m.id)

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
        candidates = self.candidates(req.model)
        if not candidates:
            self.no_target += 1
            states = {t.node_id: t.state.value for t in self.all_targets() if t.model == req.model}
            raise ModelUnavailable(f"no host can serve {req.model!r} right now (states: {states})")
        decision = None
        if self.scheduling is not None:
            candidates, decision = self.scheduling.order(candidates, req)
        if self.on_event is not None and self._decisions.allow(trio.current_time()):
            self.on_event("route.decision", decision_fields(req.model, self.node_id, candidates, decision))
        open_target: Callable[
            [RouteTarget, GenerationRequest], AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]
        ]
        open_target = self.scheduling.attempt if self.scheduling is not None else _open
        last_err: GenerationError | None = None
        for attempt, target in enumerate(candidates[:2]):
            if attempt:
                self.retries += 1
                log.info("event=route_retry model=%s target=%s after=%r", req.model, target.key, last_err)
            yielded = False
            try:
                part = _Part(open_target(target, req))
                async with part as events:
                    first = await _first_event(events)
                    yielded = True
                    report.served_by(target.node_id)
                    if first is not None:
                        report.saw(first, trio.current_time())
                    progress = Continuation(req, self.max_continuations)
                    progress.start_part(target.node_id)
                    routed = RoutedEvents(
                        self._chain(first, events, part, report, progress, target, open_target), target.node_id
                    )
                    routed.progress = progress
                    yield routed
                    return
            except GenerationError as exc:
                if exc.retry_elsewhere and not yielded and attempt == 0 and len(candidates) > 1:
                    last_err = exc
                    continue
                raise
        assert last_err is not None
        raise last_err

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
        part's model identity, never on a host that failed this generation)."""
        if first is None:
            return
        async with AsyncExitStack() as parts:  # the continuations' streams, closed when the answer is
            pending: GenerationEvent | None = first
            failed: set[str] = set()
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
                failed.add(progress.hosts[-1])
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
        failed: set[str],
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
            target = self._continuation_target(origin, failed)
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
            part = _Part(open_target(target, req))
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
            failed.add(target.node_id)
            progress.failed_part()

    def _continuation_target(self, origin: RouteTarget, failed: set[str]) -> RouteTarget | None:
        """The best ready target of ``origin``'s model identity on a host that has not failed this
        generation (None if none; a target of unknown identity never continues anything)."""
        if origin.identity is None:
            return None
        same = [
            t
            for t in self.all_targets()
            if t.model == origin.model
            and t.state == TargetState.READY
            and t.identity == origin.identity
            and t.node_id not in failed
        ]
        return min(same, key=_fixed_rule, default=None)

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


def _fixed_rule(t: RouteTarget) -> tuple:
    """The fixed rule's order: local first, then a host with a free slot before a busy one, then the
    shortest queue per slot, the nearest, and the node id (deterministic)."""
    return (not t.local, t.busy, t.queue_depth / max(1, t.slots), t.rtt_ms, t.node_id)


class _Part:
    """One part's ``open_target`` context, closable once: early by :meth:`fail` when the part's
    stream failed (so its target sees the failure and frees what it holds at once), else when
    the routed generation ends."""

    def __init__(self, cm: AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]) -> None:
        self._cm = cm
        self._open = False

    async def __aenter__(self) -> AsyncIterator[GenerationEvent]:
        events = await self._cm.__aenter__()
        self._open = True
        return events

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        if not self._open:
            return False
        self._open = False
        return await self._cm.__aexit__(*exc_info)

    async def fail(self, exc: GenerationError) -> None:
        """Close the part with ``exc`` (what its stream raised); a failure its close raises is ``exc``'s."""
        try:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
        except GenerationError:
            pass


def _open(target: RouteTarget, req: GenerationRequest) -> AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]:
    """``target.open(req)``: an attempt unmeasured (no scheduling)."""
    return target.open(req)
