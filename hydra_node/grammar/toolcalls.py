"""The model's answer back into OpenAI ``tool_calls`` (sans-IO, streaming).

The answer format for calls is fixed (docs/api.md, ``hydra_node.inference.request``)::

    <tool_call>{"name": "NAME", "arguments": {...}}</tool_call>

one block per call, several blocks (separated by optional whitespace) for parallel calls.
:class:`ToolCallParser` takes generated text in any chunks and returns, in order:

* :class:`ContentText` — text outside blocks. The text between two blocks (or before the
  first, after the last) is one *segment*; a segment made only of whitespace is dropped when
  the answer has calls (it is held back until that is known, i.e. until the next block closes
  or the generation ends);
* :class:`ParsedToolCall` — a complete block whose JSON parses, names a known function and has
  an object ``arguments`` (``"parameters"`` is accepted as its alias); the arguments are
  re-serialised compactly (``json.dumps(..., ensure_ascii=False)``, no spaces).

A malformed block (bad JSON, unknown name, arguments not an object) or an unterminated one is
returned as content text verbatim, tags included: nothing generated is ever lost. When a block
holds another open tag (the model restarted its call), the block begins at the last one and
what came before it is content. A partial
opening tag at the end of a chunk (``"...<tool_c"``) is held back until the next chunk shows
whether it is one. Any split of the same text into chunks gives the same calls and the same
content (concatenated).

**Streamed calls** (``constrained`` set: the request carried the tool-call grammar, so a block's
shape is guaranteed, see :mod:`hydra_node.grammar.toolcall_stream`): a block the grammar constrains
comes out in pieces as it is generated: :class:`ToolCallStart` once the name is complete, then
:class:`ToolCallArguments` fragments (their concatenation is exactly the arguments text the model
wrote, valid JSON of the same value; nothing of it is held back), then the
:class:`ParsedToolCall` that ends it, ``streamed=True`` (its ``arguments`` the compact
re-serialisation when they parse as an object). Which blocks the grammar constrains:
``constrained="lazy"`` (``tool_choice: auto``, the grammar starts at the first open tag): the
first block and the blocks that directly follow it; ``"whole"`` (forced calls, or calls-or-JSON):
a block that begins the answer and the blocks that directly follow it. Any other block, and a
block whose text stops fitting the shape before its name is complete, is read as above. A
streamed block cut by the end of the generation ends with ``complete=False`` when its
arguments value had not ended (the fragments so far are the arguments; nothing becomes content).
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass
from typing import Callable, Collection, Literal

from hydra_node.grammar.toolcall_stream import StreamedBlock

__all__ = [
    "OPEN_TAG",
    "CLOSE_TAG",
    "ContentText",
    "ParsedToolCall",
    "ToolCallStart",
    "ToolCallArguments",
    "ParserItem",
    "ToolCallParser",
    "default_call_id",
    "parse_call_body",
]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
_ID_ALPHABET = string.ascii_letters + string.digits


def default_call_id() -> str:
    """``call_`` + 24 random alphanumerics (the shape OpenAI's call ids have)."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ContentText:
    text: str


@dataclass(frozen=True)
class ParsedToolCall:
    index: int  # 0, 1, ... in the order the calls were made
    id: str
    name: str
    arguments: str  # compact JSON text of an object (streamed: see the module doc)
    streamed: bool = False  # announced by a ToolCallStart, its arguments sent as ToolCallArguments
    complete: bool = True  # False: a streamed call cut before its arguments ended


@dataclass(frozen=True)
class ToolCallStart:
    """A streamed call begins: its name is complete."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    """A fragment of a streamed call's arguments text."""

    index: int
    text: str


ParserItem = ContentText | ParsedToolCall | ToolCallStart | ToolCallArguments


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def parse_call_body(body: str, tool_names: Collection[str]) -> tuple[str, str] | None:
    """``(name, compact arguments JSON)`` for the text between the tags, or None if it is not a
    well-formed call of one of ``tool_names``."""
    try:
        obj = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    if not isinstance(name, str) or name not in tool_names or not isinstance(args, dict):
        return None
    text = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")  # a "\ud800" escape decodes to a lone surrogate: not text we can send
    except UnicodeEncodeError:
        return None
    return name, text


def _partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ToolCallParser:
    """Generated text in, content and calls out; see the module docstring for the rules."""

    def __init__(
        self,
        tool_names: Collection[str],
        *,
        new_id: Callable[[], str] = default_call_id,
        constrained: Literal["lazy", "whole"] | None = None,
    ):
        self._names = frozenset(tool_names)
        self._constrained = constrained
        self._may_stream = constrained is not None  # the next block is one the grammar constrains
        self._streamed: StreamedBlock | None = None  # the streamed block being read
        self._current: ToolCallStart | None = None  # its start, once announced
        self._args: list[str] = []  # its arguments so far
        self._new_id = new_id
        self._calls: list[ParsedToolCall] = []
        self._pending = ""  # unprocessed text outside a block (at most a partial open tag after a feed)
        self._segment_ws = ""  # the current segment so far, while it is only whitespace (held back)
        self._segment_started = False  # the current segment has had non-whitespace (so it streams)
        self._block: str | None = None  # text after an open tag, while inside a block
        self._scan_from = 0  # where to look for the close tag in self._block
        self._finished = False

    @property
    def calls(self) -> list[ParsedToolCall]:
        return list(self._calls)

    def feed(self, text: str) -> list[ParserItem]:
        if self._finished:
            raise RuntimeError("ToolCallParser.feed after finish")
        out: list[ParserItem] = []
        if self._streamed is not None:
            self._stream_block(text, out)
        elif self._block is not None:
            self._block += text
        else:
            self._pending += text
        self._advance(out)
        return out

    def finish(self) -> list[ParserItem]:
        """End of generation: an unterminated block, a held-back partial tag and a held-back
        whitespace segment (when there were no calls) come out as content."""
        if self._finished:
            return []
        self._finished = True
        out: list[ParserItem] = []
        if self._streamed is not None:  # cut: announced, the call ends with what came; else content
            if self._current is not None:
                self._end_streamed(out)
            else:
                self._content(OPEN_TAG + self._streamed.unread(), out)
            self._streamed = None
        if self._block is not None:
            self._content(OPEN_TAG + self._block, out)
            self._block = None
        if self._pending:
            self._content(self._pending, out)
            self._pending = ""
        if self._segment_ws and not self._calls:
            out.append(ContentText(self._segment_ws))
        self._segment_ws = ""
        return _merged(out)

    # ---- internals -----------------------------------------------------------------------
    def _advance(self, out: list[ParserItem]) -> None:
        while self._streamed is None:
            if self._block is None:
                at = self._pending.find(OPEN_TAG)
                if at < 0:
                    keep = _partial_tag_len(self._pending, OPEN_TAG)
                    self._content(self._pending[: len(self._pending) - keep], out)
                    self._pending = self._pending[len(self._pending) - keep :]
                    break
                self._content(self._pending[:at], out)
                rest, self._pending = self._pending[at + len(OPEN_TAG) :], ""
                if self._may_stream:
                    self._streamed = StreamedBlock(self._names)
                    self._stream_block(rest, out)
                    continue
                self._block, self._scan_from = rest, 0
            end = self._block.find(CLOSE_TAG, self._scan_from)
            if end < 0:
                self._scan_from = max(0, len(self._block) - len(CLOSE_TAG) + 1)
                break
            body, rest = self._block[:end], self._block[end + len(CLOSE_TAG) :]
            self._block = None
            self._pending = rest
            self._close_block(body, out)
        out[:] = _merged(out)

    def _close_block(self, body: str, out: list[ParserItem]) -> None:
        restart = body.rfind(OPEN_TAG)
        if restart >= 0:  # an open tag inside the block: the call starts at the last one
            self._content(OPEN_TAG + body[:restart], out)
            body = body[restart + len(OPEN_TAG) :]
        parsed = parse_call_body(body, self._names)
        if parsed is None:
            self._content(OPEN_TAG + body + CLOSE_TAG, out)
            return
        # a call: the whitespace-only segment before it is dropped; a new segment begins
        self._segment_ws, self._segment_started = "", False
        call = ParsedToolCall(len(self._calls), self._new_id(), *parsed)
        self._calls.append(call)
        out.append(call)

    def _stream_block(self, text: str, out: list[ParserItem]) -> None:
        """Feed the streamed block; announce its start, pass its argument text, end it."""
        blk = self._streamed
        assert blk is not None  # called only while a block streams
        args = blk.feed(text)
        if blk.name is not None and self._current is None:
            self._segment_ws, self._segment_started = "", False  # as for any call
            self._current = ToolCallStart(len(self._calls), self._new_id(), blk.name)
            out.append(self._current)
        if args:
            assert self._current is not None  # argument text comes only after the name
            self._args.append(args)
            out.append(ToolCallArguments(self._current.index, args))
        if blk.state == "done":
            self._end_streamed(out)
            self._streamed, self._pending = None, blk.rest
        elif blk.state == "failed":  # off the shape before the name: read it whole
            self._streamed, self._may_stream = None, False
            self._block, self._scan_from = blk.rest, 0

    def _end_streamed(self, out: list[ParserItem]) -> None:
        start, streamed = self._current, self._streamed
        assert start is not None and streamed is not None  # called only for an announced streamed block
        complete = streamed.value_complete
        raw = "".join(self._args)
        call = ParsedToolCall(
            start.index, start.id, start.name, _compact(raw) if complete else raw, streamed=True, complete=complete
        )
        self._calls.append(call)
        out.append(call)
        self._current, self._args = None, []

    def _content(self, text: str, out: list[ParserItem]) -> None:
        if not text:
            return
        if self._constrained == "whole" or self._calls:  # the grammar puts no text there
            self._may_stream = False
        if not self._segment_started:
            if text.isspace():
                self._segment_ws += text
                return
            text, self._segment_ws, self._segment_started = self._segment_ws + text, "", True
        out.append(ContentText(text))


def _compact(raw: str) -> str:
    """Streamed arguments re-serialised compactly when they are an object of sendable text, else as written."""
    try:
        obj = json.loads(raw, parse_constant=_no_constant)
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        text.encode("utf-8")
    except (ValueError, RecursionError, UnicodeEncodeError):
        return raw
    return text if isinstance(obj, dict) else raw


def _merged(items: list[ParserItem]) -> list[ParserItem]:
    """Adjacent content pieces joined into one."""
    out: list[ParserItem] = []
    for item in items:
        if isinstance(item, ContentText) and out and isinstance(out[-1], ContentText):
            out[-1] = ContentText(out[-1].text + item.text)
        else:
            out.append(item)
    return out
