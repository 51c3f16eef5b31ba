"""The typed server-sent events of a streamed response (pure, sans-IO).

Chat stream pieces go in (text deltas, parsed tool calls, the finish), OpenAI's Responses events
come out as dicts numbered by ``sequence_number``, in the order OpenAI sends them::

    response.created, response.in_progress,
    reasoning:    response.output_item.added, response.content_part.added (a reasoning_text part),
                  response.reasoning_text.delta..., response.reasoning_text.done,
                  response.content_part.done, response.output_item.done
    per message:  response.output_item.added, response.content_part.added,
                  response.output_text.delta..., response.output_text.done,
                  response.content_part.done, response.output_item.done
    per call:     response.output_item.added, response.function_call_arguments.delta...,
                  response.function_call_arguments.done (with the call's ``name``), response.output_item.done
    then          response.completed (its response's status is "incomplete" at max_output_tokens),
    or on error   response.failed (the response with its error and the output so far).

A reasoning model's thoughts (:meth:`ResponseEventStream.reasoning`) come before its answer; the
reasoning item closes when the answer (text or a call) begins. A response with nothing but
reasoning still gets its (empty) message, as the whole response does
(:func:`hydra_node.responses.output.output_items`).

A call streamed by the chat layer (under the tool-call grammar) comes in pieces:
:meth:`ResponseEventStream.call_start` when its name is complete (``output_item.added``),
:meth:`~ResponseEventStream.call_arguments` per fragment (one ``.delta`` each), then
:meth:`~ResponseEventStream.tool_call` with the ended call (``.done`` and ``output_item.done``
with the arguments exactly as streamed; ``status: "incomplete"`` for a call cut by
``max_output_tokens``). A call parsed whole is all four events at once, its arguments one delta.

At ``max_output_tokens`` OpenAI ends with ``response.incomplete``; here the stream still ends
with ``response.completed`` (the response says ``incomplete``), so the SDKs' stream helpers
(``get_final_response()``, the Agents SDK) return the partial response instead of raising.

:func:`sse` frames an event as ``event: TYPE`` / ``data: JSON``; :class:`ResponseStreamFormatter`
is the builder as the streamed answer's formatter (:mod:`hydra_node.api.answer`).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from typing import NamedTuple

from hydra_node.api.answer import Chunks
from hydra_node.api.chat import ChatDone, ContentDelta, ReasoningDelta, ToolCallArguments, ToolCallStart
from hydra_node.grammar.toolcalls import ParsedToolCall
from hydra_node.responses.output import (
    CallLike,
    call_item,
    delta_logprobs,
    message_item,
    new_id,
    reasoning_item,
    response_body,
    response_status,
    usage_body,
)
from hydra_node.responses.request import ResponsesCall
from hydra_node.inference import GenerationError, TokenLogprob

__all__ = ["FAILED_CODES", "ResponseEventStream", "ResponseStreamFormatter", "sse", "stored_events"]

#: ``response.error.code`` values OpenAI's schema allows; every other failure is a server_error.
FAILED_CODES = {429: "rate_limit_exceeded"}


class _Head(NamedTuple):
    """A call's item before its arguments came."""

    id: str
    name: str
    arguments: str = ""


def sse(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: ".encode() + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


class ResponseEventStream:
    """One streamed response's events. After :meth:`finish` or :meth:`fail` it is ``done`` and
    ``final`` holds the response object."""

    def __init__(
        self, call: ResponsesCall, resp_id: str, created_at: int, token: Callable[[int], str] = secrets.token_hex
    ):
        self.call, self.resp_id, self.created_at, self._token = call, resp_id, created_at, token
        self.output: list[dict] = []
        self.final: dict | None = None
        self._seq = 0
        self._msg: dict | None = None  # the message item being streamed
        self._text: list[str] = []
        self._held = ""  # leading whitespace, held until text follows (dropped before a tool call)
        self._lps: list[TokenLogprob] = []  # the open message's token logprobs, sent in deltas
        self._pending: list[TokenLogprob] = []  # logprobs not sent yet (they came without text)
        self._call: dict | None = None  # the streamed call's item (arguments "" while open)
        self._call_args: list[str] = []
        self._thinking: dict | None = None  # the reasoning item being streamed
        self._thoughts: list[str] = []

    @property
    def done(self) -> bool:
        return self.final is not None

    def _event(self, kind: str, **fields) -> dict:
        ev = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return ev

    def _response(self, status: str, **kw) -> dict:
        return response_body(self.call, self.resp_id, self.created_at, status=status, output=list(self.output), **kw)

    def start(self) -> list[dict]:
        return [
            self._event("response.created", response=self._response("in_progress")),
            self._event("response.in_progress", response=self._response("in_progress")),
        ]

    def _open_message(self) -> list[dict]:
        self._msg = message_item(new_id("msg", self._token), "", "in_progress")
        self._msg["content"] = []
        self._text, self._lps = [], []
        idx = len(self.output)
        return [
            self._event("response.output_item.added", output_index=idx, item=dict(self._msg, content=[])),
            self._event(
                "response.content_part.added",
                item_id=self._msg["id"],
                output_index=idx,
                content_index=0,
                part=message_item("", "", logprobs=self._asked([]))["content"][0],
            ),
        ]

    def reasoning(self, delta: str) -> list[dict]:
        """A piece of the model's thoughts (an open message is closed first: thoughts after text
        are a reasoning item of their own)."""
        if self.done or not delta:
            return []
        events: list[dict] = []
        if self._thinking is None:
            events = self._close_message("completed")
            self._thinking = reasoning_item(new_id("rs", self._token), "", "in_progress")
            self._thoughts = []
            idx = len(self.output)
            events += [
                self._event("response.output_item.added", output_index=idx, item=dict(self._thinking, content=[])),
                self._event(
                    "response.content_part.added",
                    item_id=self._thinking["id"],
                    output_index=idx,
                    content_index=0,
                    part={"type": "reasoning_text", "text": ""},
                ),
            ]
        self._thoughts.append(delta)
        return events + [
            self._event(
                "response.reasoning_text.delta",
                item_id=self._thinking["id"],
                output_index=len(self.output),
                content_index=0,
                delta=delta,
            )
        ]

    def _close_reasoning(self, status: str) -> list[dict]:
        if self._thinking is None:
            return []
        text, item_id, idx = "".join(self._thoughts), self._thinking["id"], len(self.output)
        item = reasoning_item(item_id, text, status)
        self._thinking = None
        self.output.append(item)
        return [
            self._event("response.reasoning_text.done", item_id=item_id, output_index=idx, content_index=0, text=text),
            *self._item_done(item_id, idx, item),
        ]

    def _item_done(self, item_id: str, idx: int, item: dict) -> list[dict]:
        """The end of an output item of one content part: the part done, then the item done."""
        return [
            self._event(
                "response.content_part.done",
                item_id=item_id,
                output_index=idx,
                content_index=0,
                part=item["content"][0],
            ),
            self._event("response.output_item.done", output_index=idx, item=item),
        ]

    def _asked(self, entries: list[TokenLogprob]) -> list[TokenLogprob] | None:
        return entries if self.call.logprobs else None

    def _close_message(self, status: str) -> list[dict]:
        if self._msg is None:
            return []
        text, item_id, idx = "".join(self._text), self._msg["id"], len(self.output)
        self._lps += self._pending
        self._pending = []
        item = message_item(item_id, text, status, self._asked(self._lps))
        self._msg = None
        self.output.append(item)
        return [
            self._event(
                "response.output_text.done",
                item_id=item_id,
                output_index=idx,
                content_index=0,
                text=text,
                logprobs=delta_logprobs(self._lps),
            ),
            *self._item_done(item_id, idx, item),
        ]

    def text(self, delta: str, logprobs: Sequence[TokenLogprob] = ()) -> list[dict]:
        """Text (and, when asked for, its tokens' logprobs; they may come with empty text)."""
        if self.done:
            return []
        if self.call.logprobs:
            self._pending += logprobs
        if not delta:
            return []
        if self._msg is None and not (self._held + delta).strip():
            self._held += delta
            return []
        delta, self._held = self._held + delta, ""
        events = self._close_reasoning("completed")
        events += self._open_message() if self._msg is None else []
        self._text.append(delta)
        sent, self._pending = self._pending, []
        self._lps += sent
        assert self._msg is not None  # open (_open_message above)
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self._msg["id"],
                output_index=len(self.output),
                content_index=0,
                delta=delta,
                logprobs=delta_logprobs(sent),
            )
        )
        return events

    def call_start(self, call: CallLike | ToolCallStart) -> list[dict]:
        """A streamed call begins (``call.arguments`` is not read): its item, ``in_progress``."""
        if self.done or self._call is not None:
            return []
        self._held, self._pending = "", []  # not text: the tokens of the call itself
        events = self._close_reasoning("completed") + self._close_message("completed")
        self._call = call_item(new_id("fc", self._token), _Head(call.id, call.name), "in_progress")
        self._call_args = []
        return events + [
            self._event("response.output_item.added", output_index=len(self.output), item=dict(self._call))
        ]

    def call_arguments(self, delta: str) -> list[dict]:
        """A fragment of the streamed call's arguments."""
        if self.done or self._call is None or not delta:
            return []
        self._call_args.append(delta)
        return [
            self._event(
                "response.function_call_arguments.delta",
                item_id=self._call["id"],
                output_index=len(self.output),
                delta=delta,
            )
        ]

    def tool_call(self, call: CallLike) -> list[dict]:
        """A call parsed whole, or the end of the streamed one (``call.complete`` False: cut)."""
        if self.done:
            return []
        events = []
        if self._call is None:  # whole: all of it now, the arguments in one delta
            events = self.call_start(call) + self.call_arguments(call.arguments)
        item, self._call = self._call, None
        assert item is not None  # started (call_start above, when it was not yet)
        args = "".join(self._call_args)
        item.update(arguments=args, status="completed" if getattr(call, "complete", True) else "incomplete")
        idx = len(self.output)
        events.append(
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=idx,
                name=item["name"],
                arguments=args,
            )
        )
        self.output.append(item)
        return events + [self._event("response.output_item.done", output_index=idx, item=item)]

    def finish(self, finish_reason: str, usage: dict, served_by: Sequence[str] = ()) -> list[dict]:
        """The last events: the open message closed (an empty one if nothing was output), then
        ``response.completed`` (with status ``completed`` or ``incomplete``; ``served_by``: every
        host that served a part, as the response's ``hydra_served_by`` when more than one did)."""
        if self.done:
            return []
        status, incomplete = response_status(finish_reason)
        events = self._close_reasoning("incomplete" if incomplete else "completed")
        if self._msg is None and not any(o["type"] != "reasoning" for o in self.output):
            events += self._open_message()
            self._text, self._held = [self._held], ""
        events += self._close_message("incomplete" if incomplete else "completed")
        self.final = self._response(status, usage=usage_body(usage), incomplete=incomplete, served_by=served_by)
        return events + [self._event("response.completed", response=self.final)]

    def fail(self, message: str, status: int = 500) -> list[dict]:
        """``response.failed``: the response so far, with its error (after nothing else)."""
        if self.done:
            return []
        self._msg = self._thinking = None
        self.final = self._response(
            "failed", error={"code": FAILED_CODES.get(status, "server_error"), "message": message}
        )
        return [self._event("response.failed", response=self.final)]


def stored_events(body: dict) -> list[dict]:
    """A stored response (``GET /v1/responses/{id}?stream=true``) as the events of a stream of it:
    each output item whole (its text, thoughts or arguments in one delta), then
    ``response.completed`` with the stored object. The sequence numbers are those of this replay
    (``starting_after`` counts them)."""
    shell = dict(body, status="in_progress", output=[], usage=None, incomplete_details=None)
    events: list[dict] = []

    def event(kind: str, **fields) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    event("response.created", response=shell)
    event("response.in_progress", response=shell)
    for idx, item in enumerate(body.get("output", [])):
        kind = item["type"]
        at = {"item_id": item["id"], "output_index": idx}
        if kind == "function_call":
            event("response.output_item.added", output_index=idx, item=dict(item, arguments="", status="in_progress"))
            if item["arguments"]:
                event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            event("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
        elif kind in ("message", "reasoning"):
            event("response.output_item.added", output_index=idx, item=dict(item, content=[], status="in_progress"))
            for j, part in enumerate(item["content"]):
                text, where = part["text"], dict(at, content_index=j)
                empty = dict(part, text="", **({"logprobs": []} if "logprobs" in part else {}))
                event("response.content_part.added", **where, part=empty)
                if kind == "reasoning":
                    if text:
                        event("response.reasoning_text.delta", **where, delta=text)
                    event("response.reasoning_text.done", **where, text=text)
                else:
                    lps = [_delta_entry(e) for e in part.get("logprobs", [])]
                    if text or lps:
                        event("response.output_text.delta", **where, delta=text, logprobs=lps)
                    event("response.output_text.done", **where, text=text, logprobs=lps)
                event("response.content_part.done", **where, part=part)
        event("response.output_item.done", output_index=idx, item=item)
    event("response.completed", response=body)
    return events


def _delta_entry(entry: dict) -> dict:
    """A stored ``output_text`` logprob entry as the delta events carry it (no bytes)."""
    top = [{"token": t["token"], "logprob": t["logprob"]} for t in entry["top_logprobs"]]
    return {"token": entry["token"], "logprob": entry["logprob"], "top_logprobs": top}


class ResponseStreamFormatter:
    """A streamed response (:class:`hydra_node.api.answer.StreamFormatter`): ``builder``'s events
    per chat event, each framed on its own; ``finished`` gets the final response (to store it).
    A failure or a drain is ``response.failed``."""

    def __init__(self, builder: ResponseEventStream, finished: Callable[[dict], None]):
        self.builder, self.finished = builder, finished

    def start(self) -> Chunks:
        return [sse(e) for e in self.builder.start()]

    def reasoning(self, k: int, delta: ReasoningDelta) -> Chunks:
        return [sse(e) for e in self.builder.reasoning(delta.text)]

    def text(self, k: int, delta: ContentDelta) -> Chunks:
        return [sse(e) for e in self.builder.text(delta.text, delta.logprobs)]

    def tool_call_start(self, k: int, start: ToolCallStart) -> Chunks:
        return [sse(e) for e in self.builder.call_start(start)]

    def tool_call_arguments(self, k: int, fragment: ToolCallArguments) -> Chunks:
        return [sse(e) for e in self.builder.call_arguments(fragment.text)]

    def tool_call(self, k: int, call: ParsedToolCall) -> Chunks:
        return [sse(e) for e in self.builder.tool_call(call)]

    def finish(self, k: int, done: ChatDone) -> Chunks:
        events = self.builder.finish(done.finish_reason, done.usage, done.served_by_all)
        assert self.builder.final is not None  # (finished)
        self.finished(self.builder.final)
        return [sse(e) for e in events]

    def end(self) -> Chunks:
        return []

    def error(self, exc: GenerationError) -> Chunks:
        return [sse(e) for e in self.builder.fail(exc.message, exc.status)]

    def interrupted(self, reason: str) -> bytes:
        return b"".join(sse(e) for e in self.builder.fail(f"stream ended: {reason}", 503))
