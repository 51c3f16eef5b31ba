"""``model: "mesh"`` on ``/v1/chat/completions``: the mixture of agents' answer in OpenAI's shapes, whole or streamed.

The members run to the end (or their deadline) before anything is answered (:class:`MoaApi`), so
"no member answered" is a 503 with a proper status. Then the answer is either the arbiter's pick,
replayed as normal chat chunks when streamed, or, with a reducer configured, the reducer's own
generation streamed as it is generated. docs/moa.md documents ``hydra_moa`` and ``x-hydra-moa``.
"""

from __future__ import annotations

import time
from contextlib import aclosing

import trio

from hydra_node.api.chat import (ChatDone, ChatOutcome, ContentDelta, ToolCallArguments, ToolCallDelta, ToolCallStart,
                                 sum_usage)
from hydra_node.api.errors import ApiError, bad
from hydra_node.api.fanout import StreamFanOut
from hydra_node.http.server import Response, StreamResponse
from hydra_node.inference import GenerationError, InvalidRequest
from hydra_node.moa.answers import MoaApi, moa_headers, moa_info
from hydra_node.moa.config import MESH_MODEL
from hydra_node.moa.mixture import MoaRun
from hydra_node.openai.format import DONE, ChunkMaker, chat_choice, sse
from hydra_node.openai.parse import ParsedBody

__all__ = ["MoaChat"]


class MoaChat:
    """``/v1/chat/completions`` for ``model: "mesh"``: :class:`MoaApi`'s answers as OpenAI bodies and chunks."""

    def __init__(self, api: MoaApi):
        self.api = api
        self.moa = api.moa

    async def answer(self, parsed: ParsedBody, nursery: trio.Nursery | None) -> Response | StreamResponse:
        """``nursery``: the request's (``Request.nursery``), where a streamed reducer runs."""
        req = parsed.request
        if req.kind != "chat":
            raise bad(f"model {MESH_MODEL!r} answers chats only: use /v1/chat/completions", "model",
                      "unsupported_model")
        if parsed.n != 1:
            raise bad(f"model {MESH_MODEL!r} answers with one choice: 'n' must be 1", "n", "unsupported_parameter")
        run = await self.moa.ask(req, self.moa.check())
        reducer = self.moa.reducer_model(run)
        if parsed.stream:
            return await self._stream(parsed, run, reducer, nursery)
        out, reducer_error = await self.api.reduced(req, run, reducer)
        info = moa_info(run, reducer, reducer_error)
        # (an answered member has its outcome)
        usages = [m.outcome.usage for m in run.answered if m.outcome is not None] + (
            [out.usage] if info["reducer"]["ran"] else [])
        body = {"id": req.request_id, "object": "chat.completion", "created": int(time.time()), "model": MESH_MODEL,
                "choices": [chat_choice(0, out, req.logprobs)], "usage": sum_usage(usages),
                "system_fingerprint": out.served_by or None, "hydra_moa": info}
        return Response.json(200, body, moa_headers(info, out.served_by))

    async def _stream(self, parsed: ParsedBody, run: MoaRun, reducer: str,
                      nursery: trio.Nursery | None) -> StreamResponse:
        req = parsed.request
        fan, reducer_error = None, ""
        if reducer:
            try:
                fan = StreamFanOut(self.moa.router, [self.moa.reducer_request(req, run, reducer)], nursery)
                await fan.open()
            except GenerationError as exc:
                fan, reducer_error = None, f"{exc.code}: {exc.message}"
            except InvalidRequest as exc:  # the candidates made the request too large, say
                fan, reducer_error = None, f"invalid_request: {exc.message}"
        info = moa_info(run, reducer, reducer_error)
        chunks = ChunkMaker(req.request_id, MESH_MODEL, int(time.time()), True, logprobs=req.logprobs)
        member_usage = [m.outcome.usage for m in run.answered if m.outcome is not None]  # (answered: it has one)

        def finish(reason: str, usage: list[dict], served_by: str) -> bytes:
            out = sse({"id": req.request_id, "object": "chat.completion.chunk", "created": chunks.created,
                       "model": MESH_MODEL, "system_fingerprint": served_by or None, "hydra_moa": info,
                       "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}]})
            return out + (chunks.usage(sum_usage(usage)) if parsed.include_usage else b"")

        async def replay(out: ChatOutcome):
            if out.content or out.logprobs:
                yield chunks.text(0, out.content or "", tuple(out.logprobs))
            for call in out.tool_calls:
                yield chunks.tool_call(0, call)
            yield finish(out.finish_reason, member_usage, out.served_by)

        async def reduced(fan: StreamFanOut):
            async with aclosing(fan.events()) as events:
                async for _, ev in events:
                    if isinstance(ev, ContentDelta):
                        yield chunks.text(0, ev.text, ev.logprobs)
                    elif isinstance(ev, ToolCallStart):
                        yield chunks.tool_call_start(0, ev)
                    elif isinstance(ev, ToolCallArguments):
                        yield chunks.tool_call_arguments(0, ev.index, ev.text)
                    elif isinstance(ev, ToolCallDelta) and not ev.call.streamed:
                        yield chunks.tool_call(0, ev.call)
                    elif isinstance(ev, ChatDone):
                        yield finish(ev.finish_reason, member_usage + [ev.usage], ev.served_by)

        async def body():
            try:
                yield chunks.role(0)
                source = reduced(fan) if fan is not None else replay(run.chosen.outcome)
                async with aclosing(source) as parts:
                    async for part in parts:
                        yield part
                yield DONE
            except GenerationError as exc:
                yield sse(ApiError.from_generation(exc).body())
                yield DONE
            finally:
                if fan is not None:
                    await fan.close()

        def interrupted(reason: str) -> bytes:
            return sse(ApiError(503, f"stream ended: {reason}", "node_shutting_down").body()) + DONE

        async def close() -> None:
            if fan is not None:
                await fan.close()

        served = fan.served_by[0] if fan is not None else run.chosen.served_by
        return StreamResponse(200, body(), on_interrupt=interrupted, finalizer=close, headers=moa_headers(info, served))
