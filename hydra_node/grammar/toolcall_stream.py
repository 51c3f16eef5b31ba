"""One grammar-constrained ``<tool_call>`` block read as it is generated (pure, sans-IO).

Under the tool-call grammar (``hydra_node.grammar.constraints.tool_call_grammar``) the text after the
open tag has exactly this shape, whitespace bounded by the grammar::

    ws "{" ws "\\"name\\"" ws ":" ws NAME ws "," ws "\\"arguments\\"" ws ":" ws VALUE ws "}" ws "</tool_call>"

:class:`StreamedBlock` follows that shape character by character. It reports the call's name as
soon as the name's closing quote arrives, then every character of ``VALUE`` (the arguments) as it
arrives: the value's end is known from its structure (brackets and strings are tracked), so no
argument text is ever held back, and the concatenated fragments are exactly ``VALUE``.

Before the name is complete, a character that does not fit the shape makes the block
``failed`` (the caller then reads it the unconstrained way, as a whole). After the name, the
call has been announced and cannot be taken back: text that does not fit (possible only if the
host did not enforce the grammar) is skipped up to the close tag, which still ends the call.
"""

from __future__ import annotations

import json
from collections.abc import Collection

__all__ = ["StreamedBlock"]

_WS, _NAME, _VALUE = object(), object(), object()
#: what follows the open tag; a str item is a literal
_SHAPE = (
    _WS,
    "{",
    _WS,
    '"name"',
    _WS,
    ":",
    _WS,
    _NAME,
    _WS,
    ",",
    _WS,
    '"arguments"',
    _WS,
    ":",
    _WS,
    _VALUE,
    _WS,
    "}",
    _WS,
    "</tool_call>",
)
_CLOSE = "</tool_call>"
_SCALAR_END = " \t\r\n}<"


class StreamedBlock:
    """Feed the text after ``<tool_call>``; read :attr:`name` (None until complete), the argument
    text each :meth:`feed` returns, :attr:`state` (``open``, ``done``, ``failed``) and :attr:`rest`
    (the text after the close tag once ``done``; everything fed once ``failed``)."""

    def __init__(self, tool_names: Collection[str]):
        self._literals = {json.dumps(n, ensure_ascii=False): n for n in tool_names}
        self.name: str | None = None
        self.state = "open"
        self.rest = ""
        self.value_complete = False  # the arguments value has ended
        self._raw: list[str] = []  # everything fed, while the name is not complete (for ``failed``)
        self._item, self._off = 0, 0  # position in _SHAPE (-1: skipping to the close tag), in a literal
        self._name = ""
        self._value_len = 0
        self._depth = 0  # inside VALUE: open brackets
        self._in_string = self._escape = False
        self._scalar = False  # VALUE is a bare number/true/false/null
        self._tail = ""  # while skipping: the last characters, watched for the close tag

    def unread(self) -> str:
        """Everything fed, while the name is not complete (the block as text, for a cut before it)."""
        return "".join(self._raw)

    def feed(self, text: str) -> str:
        """Argument text in ``text`` (may be empty). Call only while ``state == "open"``."""
        if self.state != "open":
            raise RuntimeError("StreamedBlock.feed after the block ended")
        if self.name is None:
            self._raw.append(text)
        out: list[str] = []
        for i, ch in enumerate(text):
            if not self._step(ch, out):
                self.rest = text[i + 1 :] if self.state == "done" else "".join(self._raw)
                break
        return "".join(out)

    # ---- the shape, one character at a time ---------------------------------------------
    def _step(self, ch: str, out: list[str]) -> bool:
        """Consume ``ch``; False when the block is over (``done`` or ``failed``)."""
        while self._item >= 0:
            item = _SHAPE[self._item]
            if item is _WS:
                if ch.isspace():
                    return True
                self._item += 1
            elif item is _NAME:
                return self._name_char(ch)
            elif item is _VALUE:
                fit = self._value_char(ch, out)
                if fit == "in":
                    return True
                if fit == "bad":
                    return self._mismatch(ch)
                # "after": the value (a bare scalar) ended before ch, which belongs to what follows
            else:
                assert isinstance(item, str)  # a literal (every sentinel is handled above)
                if ch != item[self._off]:
                    return self._mismatch(ch)
                self._off += 1
                if self._off == len(item):
                    self._item, self._off = self._item + 1, 0
                    if self._item == len(_SHAPE):
                        self.state = "done"
                        return False
                return True
        return self._skip(ch)

    def _name_char(self, ch: str) -> bool:
        self._name += ch
        if self._name in self._literals:
            self.name = self._literals[self._name]
            self._raw = []
            self._item += 1
            return True
        if any(lit.startswith(self._name) for lit in self._literals):
            return True
        return self._mismatch(ch)

    def _value_char(self, ch: str, out: list[str]) -> str:
        """``in`` (part of the value), ``after`` (the value had ended before it) or ``bad``."""
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
        elif self._scalar:
            if ch in _SCALAR_END:
                self._end_value()
                return "after"
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            if self._depth == 0:
                return "bad"
            self._depth -= 1
        elif ch == '"':
            self._in_string = True
        elif ch == "<" or (self._value_len == 0 and ch in ",:"):  # never outside a JSON string
            return "bad"
        elif self._value_len == 0:
            self._scalar = True
        out.append(ch)
        self._value_len += 1
        if self._depth == 0 and not self._in_string and not self._scalar:
            self._end_value()
        return "in"

    def _end_value(self) -> None:
        self.value_complete, self._scalar = True, False
        self._item += 1

    def _mismatch(self, ch: str) -> bool:
        if self.name is None:
            self.state = "failed"
            return False
        self._item = -1  # announced: skip to the close tag
        return self._skip(ch)

    def _skip(self, ch: str) -> bool:
        self._tail = (self._tail + ch)[-len(_CLOSE) :]
        if self._tail == _CLOSE:
            self.state = "done"
            return False
        return True
