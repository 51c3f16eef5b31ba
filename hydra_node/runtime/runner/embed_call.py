"""The node side of a runner's embeddings: an ``embed`` request over the runner channel and its reply.

:class:`RunnerEmbeddings` belongs to one :class:`~hydra_node.runtime.runner.supervisor.RunnerSupervisor`
and uses its channel (request ids, the pending-reply table, ``_send``, availability and stall
handling: the same rules as a generation). At most EMBEDS_IN_FLIGHT requests are in the child at
once (its work queue keeps slack for them); more wait here, up to the runner's ``queue_size``,
then 429 ``queue_full``. Embeddings do not take generation slots and are not counted in the
queue depth the router and the mesh see: the scheduler ignores them (docs in
hydra_node/runtime/child/embed.py on what they cost the batch).

The child's messages are read by :class:`~hydra_node.inference.EmbeddingAssembler` (strict: a
malformed reply is a 502; the child's own error keeps its status, e.g. 400
``context_length_exceeded``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from hydra_node.inference import EmbeddingAssembler, EmbeddingRequest, EmbeddingResult, GenerationError, QueueFull
from hydra_node.runtime.runner.records import RunnerCrashed, RunnerStalled

__all__ = ["EMBEDS_IN_FLIGHT", "GatedCall", "RunnerEmbeddings", "end_call", "next_frame"]

#: Embedding requests one runner child holds at once.
EMBEDS_IN_FLIGHT = 2
#: Reply messages buffered between the channel reader and the request.
REPLY_BUFFER = 16
#: Bound on telling the child to drop an abandoned request.
CANCEL_SEND_TIMEOUT_S = 2.0


class GatedCall:
    """One kind of side request over a runner's channel (embeddings, the tokenizer): at most
    ``in_flight`` in the child, up to the runner's ``queue_size`` waiting here (then 429), counted;
    :meth:`_call` runs the one exchange it is given under those rules."""

    def __init__(self, sup, in_flight: int) -> None:
        self._sup = sup
        self._gate = trio.Semaphore(in_flight)
        self.waiting = 0
        self.served = 0
        self.failed = 0

    async def _call(self, exchange: Callable[[Any], Awaitable[Any]], req: Any) -> Any:
        sup = self._sup
        sup._check_available()
        if self.waiting >= sup.settings.queue_size:
            raise QueueFull(sup.model.id)
        self.waiting += 1
        try:
            await self._gate.acquire()
        finally:
            self.waiting -= 1
        try:
            sup._check_available()
            result = await exchange(req)
            self.served += 1
            return result
        except GenerationError:
            self.failed += 1
            raise
        finally:
            self._gate.release()


class RunnerEmbeddings(GatedCall):
    def __init__(self, sup) -> None:
        super().__init__(sup, EMBEDS_IN_FLIGHT)

    async def embed(self, req: EmbeddingRequest) -> EmbeddingResult:
        result: EmbeddingResult = await self._call(self._exchange, req)
        return result

    async def _exchange(self, req: EmbeddingRequest) -> EmbeddingResult:
        sup = self._sup
        rid = next(sup._ids)
        send_ch, recv_ch = trio.open_memory_channel(REPLY_BUFFER)
        sup._pending[rid] = send_ch
        reply = EmbeddingAssembler(len(req.inputs), relay_status=True, served_by=sup.node_id)
        ended = False
        try:
            await sup._send({"op": "embed", "id": rid, "req": req.to_wire()})
            while True:
                msg = await self._next(recv_ch)
                try:
                    result = reply.feed(msg)
                except GenerationError:
                    ended = True
                    raise
                if result is not None:
                    ended = True
                    return result
        finally:
            await end_call(sup, rid, send_ch, ended)

    async def _next(self, recv_ch: trio.MemoryReceiveChannel) -> dict:
        return await next_frame(self._sup, recv_ch)


async def end_call(sup, rid: int, send_ch: trio.MemorySendChannel, ended: bool) -> None:
    """Forget call ``rid`` (embeddings, KV jobs); one abandoned before its answer (client gone,
    stalled) is cancelled in the child, which then drops it."""
    sup._pending.pop(rid, None)
    send_ch.close()
    if not ended:
        with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_SEND_TIMEOUT_S):
            try:
                await sup._send({"op": "cancel", "id": rid})
            except GenerationError:
                pass


async def next_frame(sup, recv_ch: trio.MemoryReceiveChannel) -> dict:
    """The runner's next frame for one call (embeddings, KV jobs); a runner silent for
    ``stall_timeout_s`` is killed (supervision restarts it) and the call fails with RunnerStalled."""
    stall = sup.settings.stall_timeout_s
    with trio.move_on_after(stall if stall > 0 else float("inf")):
        try:
            return await recv_ch.receive()
        except trio.EndOfChannel:
            raise RunnerCrashed(f"model runner for {sup.model.id!r} exited unexpectedly") from None
    sup._kill_stalled(stall)
    raise RunnerStalled(
        f"model runner for {sup.model.id!r} produced nothing for {stall:.0f} s "
        f"(a stalled RPC worker or tunnel); the runner was restarted"
    )
