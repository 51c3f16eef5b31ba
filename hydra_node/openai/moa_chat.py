"""``model: "mesh"`` on ``/v1/chat/completions``: the mixture of agents' answer in OpenAI's shapes, whole or streamed.

The members run to the end (or their deadline) before anything is answered (:class:`MoaApi`), so
"no member answered" is a 503 with a proper status. Then the answer is either the arbiter's pick,
replayed as normal chat chunks when streamed, or, with a reducer configured, the reducer's own
generation streamed as it is generated. docs/moa.md documents ``hydra_moa`` and ``x-hydra-moa``.
"""

from __future__ import annotations

import time

import trio

from hydra_node.api.answer import Chunks, nothing_to_close, stream_answer
from hydra_node.api.chat import ChatDone, served_by_field, sum_usage
from hydra_node.api.errors import bad
from hydra_node.api.fanout import StreamFanOut
from hydra_node.http.server import Response, StreamResponse
from hydra_node.inference import GenerationError, InvalidRequest
from hydra_node.moa.answers import MoaApi, moa_headers, moa_info, replay_events
from hydra_node.moa.config import MESH_MODEL
from hydra_node.moa.mixture import MoaRun
from hydra_node.openai.format import DONE, ChunkMaker, ChunkStream, chat_choice, openai_usage, sse
from hydra_node.openai.parse import ParsedBody
from hydra_node.openai.thinking import THINK_TAGS

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
            raise bad(
                f"model {MESH_MODEL!r} answers chats only: use /v1/chat/completions", "model", "unsupported_model"
            )
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
            [out.usage] if info["reducer"]["ran"] else []
        )
        body = {
            "id": req.request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MESH_MODEL,
            "choices": [chat_choice(0, out, req.logprobs, THINK_TAGS if parsed.inline_reasoning else None)],
            "usage": openai_usage(sum_usage(usages)),
            "system_fingerprint": out.served_by or None,
            "hydra_moa": info,
            **served_by_field(out.served_by_all),  # the answer's hosts after a continuation (docs/api.md)
        }
        return Response.json(200, body, moa_headers(info, out.served_by))

    async def _stream(
        self, parsed: ParsedBody, run: MoaRun, reducer: str, nursery: trio.Nursery | None
    ) -> StreamResponse:
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
        fmt = _MoaChunkStream(chunks, info, member_usage, reduced=fan is not None, include_usage=parsed.include_usage)
        if fan is not None:
            return stream_answer(fan.events, fmt, close=fan.close, headers=moa_headers(info, fan.served_by[0]))
        out = run.chosen.outcome
        assert out is not None  # (the pick answered)
        return stream_answer(
            lambda: replay_events(out), fmt, close=nothing_to_close, headers=moa_headers(info, run.chosen.served_by)
        )


class _MoaChunkStream(ChunkStream):
    """The mesh's answer as chat chunks: the reducer's as it is generated, or the pick's replayed;
    the finish chunk carries ``hydra_moa``, ``hydra_served_by`` (every host of the answer after a
    continuation) and the usage of every member (and of the reducer, ``reduced``), which follows it
    at once with ``include_usage``."""

    def __init__(self, chunks: ChunkMaker, info: dict, member_usage: list[dict], *, reduced: bool, include_usage: bool):
        super().__init__(chunks, include_usage=include_usage)
        self.info, self.member_usage, self.reduced = info, member_usage, reduced

    def finish(self, k: int, done: ChatDone) -> Chunks:
        c = self.chunks
        usage = self.member_usage + ([done.usage] if self.reduced else [])
        out = sse(
            {
                "id": c.id,
                "object": "chat.completion.chunk",
                "created": c.created,
                "model": MESH_MODEL,
                "system_fingerprint": done.served_by or None,
                "hydra_moa": self.info,
                "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": done.finish_reason}],
                **served_by_field(done.served_by_all),  # as every dialect's finish chunk (docs/api.md)
            }
        )
        return [out + (c.usage(sum_usage(usage)) if self.include_usage else b"")]

    def end(self) -> Chunks:
        return [DONE]  # (the usage came with the finish)
