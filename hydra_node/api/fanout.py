"""Several chat generations at once, their events merged: ``n`` > 1 (and completions with several prompts).

:func:`run_all` (a complete answer) runs the generations in a nursery. :class:`StreamFanOut` (a
streamed answer) cannot open one itself: the merged events are read by the HTTP writer from an
async generator, and a generator may not hold a nursery open across ``yield`` (trio cancel scopes
must nest; the writer closes the body inside its own scopes). So each generation runs in a task of
the *request's* nursery (``Request.nursery``, opened by the HTTP connection around the handler and
the whole response, see hydra_node/http/connection.py), passed in by the dialect: every task is in
the request's tree and is cancelled with it (client gone, server stopped). Within that, a task's
life is bounded by this object: :meth:`StreamFanOut.open` returns once every generation is open (or
raises the first routing error, with the others closed), :meth:`events` yields ``(choice index,
event)`` as they come, and :meth:`close` (the body's ``finally`` and the response's finalizer)
cancels what is left and waits for every task to have left its generation (so each is cancelled
where it runs). A task never raises: a failure becomes an event (the error) on the merged stream.
"""

from __future__ import annotations

from typing import AsyncGenerator, Sequence

import trio

from hydra_node.api.chat import ChatDone, ChatEvent, ChatOutcome, complete_chat, stream_chat
from hydra_node.api.router_api import RouterApi
from hydra_node.inference import GenerationError, GenerationRequest

__all__ = ["run_all", "StreamFanOut"]


async def run_all(router: RouterApi, reqs: Sequence[GenerationRequest]) -> list[ChatOutcome]:
    """Every request to the end, concurrently; the first :class:`GenerationError` is raised (the
    others are cancelled)."""
    if len(reqs) == 1:
        return [await complete_chat(router, reqs[0])]
    results: list[ChatOutcome | None] = [None] * len(reqs)
    errors: list[GenerationError] = []

    async def one(i: int, cancel: trio.CancelScope) -> None:
        try:
            results[i] = await complete_chat(router, reqs[i])
        except GenerationError as exc:
            errors.append(exc)
            cancel.cancel()

    async with trio.open_nursery() as nursery:
        for i in range(len(reqs)):
            nursery.start_soon(one, i, nursery.cancel_scope)
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def _unexpected(exc: BaseException) -> GenerationError:
    return GenerationError(f"generation failed: {type(exc).__name__}", code="internal_error", status=500)


class StreamFanOut:
    """``len(reqs)`` streamed generations whose events are merged (see the module doc); their
    tasks run in ``nursery``, the request's (``Request.nursery``)."""

    def __init__(self, router: RouterApi, reqs: Sequence[GenerationRequest], nursery: trio.Nursery | None):
        if nursery is None:
            raise RuntimeError("StreamFanOut runs in the request's nursery (Request.nursery, set by the HTTP server)")
        self.router, self.reqs, self._nursery = router, list(reqs), nursery
        self._send, self._recv = trio.open_memory_channel(4 * len(self.reqs))
        self._scopes = [trio.CancelScope() for _ in self.reqs]
        self._opened = [trio.Event() for _ in self.reqs]
        self._done = [trio.Event() for _ in self.reqs]
        self._open_errors: list[GenerationError | None] = [None] * len(self.reqs)
        #: the node serving each generation, known once it is open (for the response headers)
        self.served_by: list[str] = [""] * len(self.reqs)

    async def open(self) -> "StreamFanOut":
        """Open every generation; raise the first routing error (all of them closed first)."""
        for i in range(len(self.reqs)):
            self._nursery.start_soon(self._pump, i, name=f"hydra.api.fanout[{i}]")
        try:
            for ev in self._opened:
                await ev.wait()
        except BaseException:
            await self.close()
            raise
        err = next((e for e in self._open_errors if e is not None), None)
        if err is not None:
            await self.close()
            raise err
        return self

    async def _pump(self, i: int) -> None:
        try:
            with self._scopes[i]:
                try:
                    async with stream_chat(self.router, self.reqs[i]) as events:
                        self.served_by[i] = getattr(events, "served_by", "")
                        self._opened[i].set()
                        async for ev in events:
                            await self._send.send((i, ev))
                except GenerationError as exc:
                    await self._failed(i, exc)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the reader is gone: nothing left to tell
                except Exception as exc:  # a pump never raises (it would end the request): the choice's error
                    await self._failed(i, _unexpected(exc))
        finally:
            self._opened[i].set()
            self._done[i].set()

    async def _failed(self, i: int, exc: GenerationError) -> None:
        if not self._opened[i].is_set():
            self._open_errors[i] = exc
            return
        try:
            await self._send.send((i, exc))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def events(self) -> AsyncGenerator[tuple[int, ChatEvent], None]:
        """``(index, event)`` until every generation is done; a generation's failure is raised."""
        left = len(self.reqs)
        while left:
            i, ev = await self._recv.receive()
            if isinstance(ev, GenerationError):
                raise ev
            if isinstance(ev, ChatDone):
                left -= 1
            yield i, ev

    async def close(self) -> None:
        """Cancel what still runs and wait until every task has left its generation (shielded:
        leaving always cancels the generations where they run; idempotent)."""
        with trio.CancelScope(shield=True):
            for scope in self._scopes:
                scope.cancel()
            await self._recv.aclose()
            for ev in self._done:
                await ev.wait()
