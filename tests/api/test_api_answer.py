"""The one streamed-answer loop (hydra_node/api/answer.py) with a formatter that records what it is asked:
every chat event goes to its method in order and each chunk is written on its own, a failure part-way
ends the body with the formatter's error chunks (never its end), a drain is the formatter's
``interrupted`` bytes, and ``close`` is awaited however the body ends, also when it never started."""

from __future__ import annotations

import pytest

from hydra_node.api.answer import stream_answer, stream_body
from hydra_node.api.chat import ChatDone, ContentDelta, ToolCallArguments, ToolCallDelta, ToolCallStart
from hydra_node.grammar.toolcalls import ParsedToolCall
from hydra_node.inference import GenerationError

USAGE = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
STREAMED = ParsedToolCall(0, "call_1", "get_weather", '{"city":"Paris"}', streamed=True)
WHOLE = ParsedToolCall(0, "call_2", "get_time", "{}")
EVENTS = [
    (0, ContentDelta("Hel")),
    (0, ContentDelta("lo")),
    (1, ToolCallStart(0, "call_1", "get_weather")),
    (1, ToolCallArguments(0, '{"city":')),
    (1, ToolCallArguments(0, '"Paris"}')),
    (1, ToolCallDelta(STREAMED)),
    (0, ToolCallDelta(WHOLE)),
    (0, ChatDone("tool_calls", USAGE, "host-a")),
    (1, ChatDone("tool_calls", USAGE, "host-b")),
]
FAILED = GenerationError("the host went away", code="host_lost", status=502)


class Recorder:
    """A :class:`StreamFormatter` that writes one chunk per call, naming it (``start``: two)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def _say(self, *what) -> list[bytes]:
        self.calls.append(what)
        return [repr(what).encode()]

    def start(self):
        return self._say("start") + [b"start, second chunk"]

    def text(self, k, delta):
        return self._say("text", k, delta.text)

    def tool_call_start(self, k, start):
        return self._say("tool_call_start", k, start.id, start.name)

    def tool_call_arguments(self, k, fragment):
        return self._say("tool_call_arguments", k, fragment.index, fragment.text)

    def tool_call(self, k, call):
        return [] if call.streamed else self._say("tool_call", k, call.id)  # [] : nothing written

    def finish(self, k, done):
        return self._say("finish", k, done.finish_reason, done.served_by)

    def end(self):
        return self._say("end")

    def error(self, exc):
        return self._say("error", exc.code, exc.status)

    def interrupted(self, reason):
        self.calls.append(("interrupted", reason))
        return b"bye"


class Source:
    """``events()`` for the loop: ``pairs``, then ``fail`` raised if given; counts opens and closes,
    and the ``close`` calls of the answer."""

    def __init__(self, pairs, fail: BaseException | None = None):
        self.pairs, self.fail = pairs, fail
        self.opened = self.left = self.closes = 0

    async def events(self):
        self.opened += 1
        try:
            for pair in self.pairs:
                yield pair
            if self.fail is not None:
                raise self.fail
        finally:
            self.left += 1

    async def close(self) -> None:
        self.closes += 1


async def collect(body) -> list[bytes]:
    return [chunk async for chunk in body]


async def test_every_event_goes_to_its_formatter_method_in_order_then_the_end():
    fmt, src = Recorder(), Source(EVENTS)
    chunks = await collect(stream_body(src.events, fmt, src.close))
    assert fmt.calls == [
        ("start",),
        ("text", 0, "Hel"),
        ("text", 0, "lo"),
        ("tool_call_start", 1, "call_1", "get_weather"),
        ("tool_call_arguments", 1, 0, '{"city":'),
        ("tool_call_arguments", 1, 0, '"Paris"}'),  # the streamed call's end wrote nothing: []
        ("tool_call", 0, "call_2"),
        ("finish", 0, "tool_calls", "host-a"),
        ("finish", 1, "tool_calls", "host-b"),
        ("end",),
    ]
    expected = [repr(call).encode() for call in fmt.calls]
    expected.insert(1, b"start, second chunk")
    assert chunks == expected  # each chunk a formatter returned is written on its own, in order
    assert (src.opened, src.left, src.closes) == (1, 1, 1)


async def test_a_failure_mid_stream_ends_with_the_error_chunks_and_still_closes():
    fmt, src = Recorder(), Source(EVENTS[:3], fail=FAILED)
    chunks = await collect(stream_body(src.events, fmt, src.close))
    assert fmt.calls == [
        ("start",),
        ("text", 0, "Hel"),
        ("text", 0, "lo"),
        ("tool_call_start", 1, "call_1", "get_weather"),
        ("error", "host_lost", 502),
    ]
    assert chunks[-1] == repr(("error", "host_lost", 502)).encode()  # no end after the error
    assert (src.left, src.closes) == (1, 1)


async def test_any_other_failure_propagates_and_still_closes():
    fmt, src = Recorder(), Source(EVENTS[:1], fail=RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        await collect(stream_body(src.events, fmt, src.close))
    assert fmt.calls == [("start",), ("text", 0, "Hel")] and (src.left, src.closes) == (1, 1)


async def test_a_client_gone_mid_stream_closes_the_source_and_the_answer():
    fmt, src = Recorder(), Source(EVENTS)
    resp = stream_answer(src.events, fmt, close=src.close, headers=[("x-hydra-served-by", "host-a")])
    assert resp.status == 200 and resp.headers == [("x-hydra-served-by", "host-a")]
    got = [await resp.body.__anext__() for _ in range(4)]  # start (2 chunks) and two texts, then gone
    await resp.close()  # what the HTTP server does however a response ends
    assert len(got) == 4 and fmt.calls[-1] == ("text", 0, "lo")
    assert src.left == 1 and src.closes >= 1  # (close is idempotent: the body's finally and the finalizer)


async def test_a_response_never_started_is_closed_by_its_finalizer_without_opening_the_source():
    fmt, src = Recorder(), Source(EVENTS)
    resp = stream_answer(src.events, fmt, close=src.close, headers=[])
    await resp.close()
    assert (src.opened, src.closes) == (0, 1) and fmt.calls == []


async def test_a_drain_ends_the_stream_with_the_formatters_interrupted_bytes():
    fmt, src = Recorder(), Source(EVENTS)
    resp = stream_answer(src.events, fmt, close=src.close, headers=[])
    await resp.body.__anext__()
    await resp.close()
    assert resp.on_interrupt is not None and resp.on_interrupt("the node is shutting down") == b"bye"
    assert fmt.calls[-1] == ("interrupted", "the node is shutting down") and src.closes >= 1
