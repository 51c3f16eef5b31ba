"""A stopping node hands its generations over to other hosts (docs/scheduler.md "Hand-over on stop").

:class:`Handover` is the node's one record of the stop: from :meth:`Handover.stop_admitting` on,
the node announces its models as ``stopping`` (no peer routes to them), refuses peers' new
``generate`` streams before their first event (:meth:`Handover.refusal`: 503 ``draining``,
retryable, so the requester's router tries another target) and its own router stops choosing its
local runners while a peer hosts the model (:mod:`hydra_node.routing.local`). Every generation a
local runner serves is opened through :meth:`Handover.open` (peers' requests and this node's own
clients alike); after the grace, :meth:`Handover.hand_over` ends each one still running with
:class:`Draining` raised out of its event stream (closing it cancels it in the runner), which the
requester's router continues on another host of the same model identity
(:mod:`hydra_node.routing.continuation`: ``draining`` is continuable).

:class:`HandoverRouter` is the node's router, counting the generations it routes (its own API's
clients), so the stop sequence waits for those continued on a peer before draining the API.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, ParamSpec

import trio

from hydra_node.inference import GenerationError, GenerationEvent, GenerationRequest
from hydra_node.routing.router import RoutedEvents, Router
from hydra_node.routing.target import OpenGeneration

__all__ = ["ANNOUNCED_STATE", "Draining", "Handover", "HandoverPhase", "HandoverRouter"]

P = ParamSpec("P")

#: The model state a stopping node announces (older peers list it as ``unknown``; nobody routes to it).
ANNOUNCED_STATE = "stopping"


class HandoverPhase(enum.StrEnum):
    SERVING = "serving"  # admits every request
    STOPPING = "stopping"  # admits no new one from peers; running ones go on (the grace)
    HANDING_OVER = "handing_over"  # every running generation ends with Draining


class Draining(GenerationError):
    """This node is stopping: the generation goes on elsewhere (503, retryable, continuable)."""

    def __init__(self, node_id: str, *, handed_over: bool):
        what = "handed its generation over" if handed_over else "admits no new generation"
        super().__init__(
            f"node {node_id[:16]} is stopping and {what}; another host of the model takes it",
            code="draining",
            status=503,
            retryable=True,
            retry_after=1.0,
        )


class Handover:
    """The stop's phases and the registry of local generations (``node_id``: names this node in errors)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.phase = HandoverPhase.SERVING
        #: Generations ended by :meth:`hand_over` (``/api/status`` could show it; the log does).
        self.handed_over = 0
        self._running: set[trio.CancelScope] = set()  # one per local generation waiting for an event
        self._open = 0  # local generations open now
        self._idle = trio.Event()
        self._idle.set()
        self._routed = 0  # generations the node's router is relaying (its own API's clients)
        self._routed_idle = trio.Event()
        self._routed_idle.set()
        self._serving = 0  # peers' generate streams being answered (their error events included)
        self._serving_idle = trio.Event()
        self._serving_idle.set()

    @property
    def admitting(self) -> bool:
        return self.phase is HandoverPhase.SERVING

    @property
    def open_generations(self) -> int:
        return self._open

    def stop_admitting(self) -> None:
        """The stop began: refuse peers' new generations, announce ``stopping``."""
        if self.phase is HandoverPhase.SERVING:
            self.phase = HandoverPhase.STOPPING

    def hand_over(self) -> None:
        """The grace is over: every local generation still running ends with :class:`Draining`."""
        self.stop_admitting()
        self.phase = HandoverPhase.HANDING_OVER
        for scope in list(self._running):
            scope.cancel()

    def refusal(self) -> Draining | None:
        """What a peer's new ``generate`` stream is answered with while stopping (None: admitted)."""
        return None if self.admitting else Draining(self.node_id, handed_over=False)

    async def wait_local_idle(self) -> None:
        """Until no local generation is open (the grace waits on it, bounded by its caller)."""
        await self._idle.wait()

    async def wait_peers_answered(self) -> None:
        """Until every peer's ``generate`` stream (:meth:`serving`) was answered to its end: after
        :meth:`hand_over`, their ``draining`` error events are on the wire before the links close."""
        await self._serving_idle.wait()

    def serving(self, handler: Callable[P, Awaitable[None]]) -> Callable[P, Awaitable[None]]:
        """``handler`` (a peer's ``generate`` stream handler), counted while it runs."""

        async def counted(*args: P.args, **kwargs: P.kwargs) -> None:
            self._serving += 1
            if self._serving == 1:
                self._serving_idle = trio.Event()
            try:
                await handler(*args, **kwargs)
            finally:
                self._serving -= 1
                if self._serving == 0:
                    self._serving_idle.set()

        return counted

    async def wait_routed_idle(self) -> None:
        """Until the router relays no generation (its own clients' streams, continued on peers)."""
        await self._routed_idle.wait()

    def open(self, open_gen: OpenGeneration) -> OpenGeneration:
        """``open_gen`` (a local runner's ``generate``) as a generation :meth:`hand_over` can end."""

        def opened(req: GenerationRequest) -> AbstractAsyncContextManager[AsyncIterator[GenerationEvent]]:
            return self._opened(open_gen, req)

        return opened

    @asynccontextmanager
    async def _opened(
        self, open_gen: OpenGeneration, req: GenerationRequest
    ) -> AsyncIterator[AsyncIterator[GenerationEvent]]:
        if self.phase is HandoverPhase.HANDING_OVER:
            raise Draining(self.node_id, handed_over=True)
        self._open += 1
        self._idle = trio.Event() if self._open == 1 else self._idle
        try:
            async with open_gen(req) as events:
                watched = self._watched(events)
                try:
                    yield watched
                finally:
                    await watched.aclose()
        finally:
            self._open -= 1
            if self._open == 0:
                self._idle.set()

    async def _watched(self, events: AsyncIterator[GenerationEvent]) -> AsyncGenerator[GenerationEvent, None]:
        """``events`` until :meth:`hand_over`: then :class:`Draining` (raised between events, or
        while waiting for one, which is cancelled)."""
        it = aiter(events)
        while True:
            if self.phase is HandoverPhase.HANDING_OVER:
                self.handed_over += 1
                raise Draining(self.node_id, handed_over=True)
            scope = trio.CancelScope()
            self._running.add(scope)
            try:
                with scope:
                    ev = await anext(it)
            except StopAsyncIteration:
                return
            except GenerationError:
                if scope.cancel_called:  # what the runner made of the cancel: the hand-over's
                    continue
                raise
            finally:
                self._running.discard(scope)
            if scope.cancelled_caught:
                continue  # the loop's top raises Draining
            yield ev

    @asynccontextmanager
    async def routing(self) -> AsyncIterator[None]:
        """Count one generation the node's router relays while the block runs."""
        self._routed += 1
        if self._routed == 1:
            self._routed_idle = trio.Event()
        try:
            yield
        finally:
            self._routed -= 1
            if self._routed == 0:
                self._routed_idle.set()


class HandoverRouter(Router):
    """The node's router: every generation it routes is counted by ``handover`` (:meth:`Handover.routing`)."""

    def __init__(self, node_id: str, *, handover: Handover, **kwargs: Any) -> None:
        super().__init__(node_id, **kwargs)
        self.handover = handover

    @asynccontextmanager
    async def generate(self, req: GenerationRequest) -> AsyncIterator[RoutedEvents[GenerationEvent]]:
        async with self.handover.routing(), super().generate(req) as events:
            yield events
