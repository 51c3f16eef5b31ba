"""The node side of a runner's tokenizer: a ``tokenize`` op over the runner channel and its one reply.

:class:`RunnerTokenizer` belongs to one :class:`~hydra_node.runtime.runner.supervisor.RunnerSupervisor`
and uses its channel (request ids, the pending-reply table, ``_send``, availability and stall
handling: the rules of an embedding, runner/embed_call.py). At most TOKENIZE_IN_FLIGHT requests
are in the child at once (its tokenizer thread queues a few more: child/vocab_ops.py); more wait
here, up to the runner's ``queue_size``, then 429 ``queue_full``. They take no generation slot:
the child answers them on their own thread.

The child's reply is read strictly (:meth:`TokenizeResult.from_wire`: a malformed one is a 502);
its own error keeps its status (400 for a token outside the vocabulary, 413 for an answer past a
channel frame).
"""

from __future__ import annotations

from dataclasses import replace

import trio

from hydra_node.inference import TokenizeRequest, TokenizeResult, remote_error_from_wire
from hydra_node.runtime.child.channel import RunnerProtocolError
from hydra_node.runtime.runner.embed_call import GatedCall, end_call, next_frame

__all__ = ["TOKENIZE_IN_FLIGHT", "RunnerTokenizer"]

#: Tokenize requests one runner child holds at once (below child/vocab_ops.TOKENIZE_QUEUE).
TOKENIZE_IN_FLIGHT = 4


class RunnerTokenizer(GatedCall):
    def __init__(self, sup) -> None:
        super().__init__(sup, TOKENIZE_IN_FLIGHT)

    async def tokenize(self, req: TokenizeRequest) -> TokenizeResult:
        result: TokenizeResult = await self._call(self._exchange, req)
        return result

    async def _exchange(self, req: TokenizeRequest) -> TokenizeResult:
        sup = self._sup
        rid = next(sup._ids)
        send_ch, recv_ch = trio.open_memory_channel(1)
        sup._pending[rid] = send_ch
        ended = False
        try:
            await sup._send({"op": "tokenize", "id": rid, "req": req.to_wire()})
            msg = await next_frame(sup, recv_ch)
            ended = True
            if msg.get("op") == "error":
                raise remote_error_from_wire(msg, relay_status=True)
            if msg.get("op") != "tokenized":
                raise RunnerProtocolError(f"runner answered a tokenize request with {msg.get('op')!r:.40}")
            return replace(TokenizeResult.from_wire(msg), served_by=sup.node_id)
        finally:
            await end_call(sup, rid, send_ch, ended)
