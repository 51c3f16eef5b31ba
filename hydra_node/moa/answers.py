"""``model: "mesh"`` behind every API dialect: the mixture of agents' answers and what they say about themselves.

The members run to the end (or their deadline) before anything is answered, so "no member answered"
is a 503 with a proper status. Then the answer is either the arbiter's pick — replayed as normal
chat chunks when streamed — or, on genuine conflict with a reducer configured, the reducer's own
generation (streamed as it is generated). Should the reducer fail before its first token, the
arbiter's pick is returned and ``hydra_moa.reducer.error`` says why.

Every answer says what happened, as ``hydra_moa`` in the body (streams: on the finish chunk) and
compact in the ``x-hydra-moa`` header (JSON): members with status and latency, the answer groups,
the pick, whether there was a majority and whether the reducer ran. ``usage`` adds up every member
that answered and the reducer. docs/moa.md documents both.

A reasoning answer keeps the thoughts of the model that wrote it (the pick's, or the reducer's:
:mod:`hydra_node.moa.mixture`); a replayed stream sends them first, as a stream of that model would.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncGenerator, Awaitable, Callable

import trio

from hydra_node.api.answer import EventSource, nothing_to_close
from hydra_node.api.chat import (
    ChatDone,
    ChatEvent,
    ChatOutcome,
    ContentDelta,
    ReasoningDelta,
    ToolCallDelta,
    complete_chat,
    sum_usage,
)
from hydra_node.api.errors import ApiError
from hydra_node.api.fanout import StreamFanOut
from hydra_node.api.router_api import RouterApi
from hydra_node.http.messages import served_by_header
from hydra_node.inference import GenerationError, GenerationRequest, InvalidRequest, ModelCaps
from hydra_node.moa.config import MESH_MODEL
from hydra_node.moa.mixture import MixtureOfAgents, MoaRun

__all__ = [
    "MoaApi",
    "caps_of",
    "complete_answer",
    "moa_headers",
    "moa_info",
    "moa_header",
    "open_chat_events",
    "replay_events",
]

#: Longest member error quoted in ``hydra_moa`` (the full text is in the node's log).
MAX_ERROR_CHARS = 300


def moa_info(run: MoaRun, reducer: str, reducer_error: str = "") -> dict:
    """``hydra_moa``: members, groups, the pick and the reducer (``reducer``: "" when none ran)."""
    ran = bool(reducer) and not reducer_error
    return {
        "members": [
            {
                "model": m.model,
                "status": m.status,
                "latency_ms": m.latency_ms,
                "served_by": m.served_by or None,
                "group": run.verdict.group_of(m.model),
                "usage": m.outcome.usage if m.outcome is not None else None,
                "error": m.error[:MAX_ERROR_CHARS] or None,
            }
            for m in run.members
        ],
        "groups": [{"members": list(g.members), "key": g.key[:MAX_ERROR_CHARS]} for g in run.verdict.groups],
        "majority": run.verdict.majority,
        "chosen": run.verdict.chosen,
        "reducer": {"model": reducer or None, "ran": ran, "error": reducer_error[:MAX_ERROR_CHARS] or None},
        "answer_from": reducer if ran else run.verdict.chosen,
        "deadline_s": run.deadline_s,
    }


def moa_header(info: dict) -> str:
    """The ``x-hydra-moa`` value: compact JSON (ASCII) without the answer keys and error texts."""
    short = {
        "members": [{k: m[k] for k in ("model", "status", "latency_ms", "group")} for m in info["members"]],
        "groups": [g["members"] for g in info["groups"]],
        "majority": info["majority"],
        "chosen": info["chosen"],
        "reducer_ran": info["reducer"]["ran"],
        "answer_from": info["answer_from"],
    }
    return json.dumps(short, separators=(",", ":"))


class MoaApi:
    """The HTTP side of :class:`MixtureOfAgents`, shared by every dialect: whether a request is for
    ``mesh``, its ``/v1/models`` entry, and its whole answer (the OpenAI chat rendering, whole or
    streamed, is :mod:`hydra_node.openai.moa_chat`)."""

    def __init__(self, moa: MixtureOfAgents):
        self.moa = moa

    def handles(self, model: str) -> bool:
        return model == MESH_MODEL  # reserved: never a hosted model's id (hydra_node.models.RESERVED_MODEL_IDS)

    def model_obj(self, now: int) -> dict | None:
        """The ``/v1/models`` entry for ``mesh`` (None when it is not listed)."""
        if not self.moa.listed():
            return None
        return {
            "id": MESH_MODEL,
            "object": "model",
            "created": now,
            "owned_by": "hydra",
            "hosts": [],
            "states": {},
            "members": self.moa.members(),
            "experimental": True,
            "caps": self.moa.capabilities().to_wire(),
        }

    def capabilities(self) -> ModelCaps:
        """What ``mesh`` can do now (:meth:`MixtureOfAgents.capabilities`)."""
        return self.moa.capabilities()

    async def answer(self, req: GenerationRequest) -> tuple[ChatOutcome, dict, list[tuple[str, str]]]:
        """The whole answer to chat ``req`` for the other APIs (``/v1/messages``, ``/v1/responses``):
        the outcome (its ``usage`` summed over every member and the reducer), ``hydra_moa`` and the
        response headers. The reducer, when it runs, is not streamed here."""
        run = await self.moa.ask(req, self.moa.check())
        reducer = self.moa.reducer_model(run)
        out, reducer_error = await self.reduced(req, run, reducer)
        info = moa_info(run, reducer, reducer_error)
        # (an answered member has its outcome)
        usages = [m.outcome.usage for m in run.answered if m.outcome is not None] + (
            [out.usage] if info["reducer"]["ran"] else []
        )
        out = dataclasses.replace(out, usage=sum_usage(usages))
        return out, info, moa_headers(info, out.served_by)

    async def reduced(self, req: GenerationRequest, run: MoaRun, reducer: str) -> tuple[ChatOutcome, str]:
        """The reducer's answer, or the arbiter's pick and why the reducer did not answer."""
        out = run.chosen.outcome
        assert out is not None
        if reducer:
            try:
                return await complete_chat(self.moa.router, self.moa.reducer_request(req, run, reducer)), ""
            except GenerationError as exc:
                return out, f"{exc.code}: {exc.message}"
            except InvalidRequest as exc:  # the candidates made the request too large, say
                return out, f"invalid_request: {exc.message}"
        return out, ""


def caps_of(router: RouterApi, moa: "MoaApi | None", model: str) -> ModelCaps:
    """What ``model`` can do: the mixture's for ``mesh``, else its hosts' (``router.capabilities``)."""
    if moa is not None and moa.handles(model):
        return moa.capabilities()
    return router.capabilities(model)


async def complete_answer(
    router: RouterApi, moa: "MoaApi | None", req: GenerationRequest
) -> tuple[ChatOutcome, list[tuple[str, str]]]:
    """``(outcome, headers)`` of one whole chat for /v1/messages and /v1/responses: the mixture of
    agents' answer for ``mesh``, else the router's. A failure is an :class:`ApiError`."""
    try:
        if moa is not None and moa.handles(req.model):
            out, _, headers = await moa.answer(req)
            return out, headers
        out = await complete_chat(router, req)
    except GenerationError as exc:
        raise ApiError.from_generation(exc) from None
    return out, served_by_header(out.served_by)


async def open_chat_events(
    router: RouterApi, moa: "MoaApi | None", req: GenerationRequest, nursery: trio.Nursery | None
) -> tuple[EventSource, Callable[[], Awaitable[None]], list[tuple[str, str]]]:
    """``(events, close, headers)`` of one streamed chat for /v1/messages and /v1/responses
    (:func:`hydra_node.api.answer.stream_answer` takes them), opened before the 200 so routing
    errors get a proper status: the router's stream, or for ``mesh`` the mixture of agents'
    finished answer replayed (``events()`` yields ``(0, event)`` pairs). ``nursery``: the
    request's (``Request.nursery``), where the generation runs."""
    if moa is not None and moa.handles(req.model):
        out, _, headers = await moa.answer(req)
        return (lambda: replay_events(out)), nothing_to_close, headers
    fan = StreamFanOut(router, [req], nursery)
    try:
        await fan.open()
    except GenerationError as exc:
        raise ApiError.from_generation(exc) from None
    return fan.events, fan.close, served_by_header(fan.served_by[0])


async def replay_events(out: ChatOutcome) -> AsyncGenerator[tuple[int, ChatEvent], None]:
    """A finished answer as the chat events of a stream of it: ``(0, event)`` pairs like
    :meth:`StreamFanOut.events` (for ``mesh`` streams): its text (with its token logprobs, also
    when it has no text: a call's tokens), each call whole (``streamed`` False: no
    :class:`ToolCallStart` came for it), then the end; a reasoning answer's thoughts first."""
    if out.reasoning:
        yield 0, ReasoningDelta(out.reasoning)
    if out.content or out.logprobs:
        yield 0, ContentDelta(out.content or "", tuple(out.logprobs))
    for call in out.tool_calls:
        yield 0, ToolCallDelta(dataclasses.replace(call, streamed=False))
    yield 0, ChatDone(out.finish_reason, out.usage, out.served_by, out.served_by_all)


def moa_headers(info: dict, served_by: str) -> list[tuple[str, str]]:
    return [("x-hydra-moa", moa_header(info))] + served_by_header(served_by)
