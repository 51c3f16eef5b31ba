"""Reasoning models: which format a chat template uses, and its output split into thoughts and answer (pure).

Formats (:data:`~hydra_node.inference.capabilities.REASONING_FORMATS`, docs/reasoning.md):

* ``"think"``: ``<think>…</think>`` then the answer (Qwen3, DeepSeek-R1 distills, GLM). The
  block may be written by the model itself (Qwen3: its generation prompt opens nothing) or
  opened by the generation prompt (DeepSeek-R1 distills: the prompt ends ``<think>\\n``); a
  template with a thinking switch (``enable_thinking``) writes an empty closed block
  (``<think>\\n\\n</think>\\n\\n``) when thinking is off.
* ``"gpt-oss"``: the harmony channels, ``<|channel|>analysis<|message|>…<|end|>`` (reasoning)
  then ``<|start|>assistant<|channel|>final<|message|>…`` (the answer); ``commentary`` (a
  preamble, or a tool call's body) is answer text too.

:func:`detect` reads a template (and, given a ``render`` callable, renders its generation prompt
with the switch on, off and unset) into the reasoning fields of a
:class:`~hydra_node.inference.capabilities.ModelCaps`. :class:`ReasoningSplitter` turns the
generated text, piece by piece, into reasoning and answer pieces; where it starts
(:meth:`ReasoningSplitter.start`) comes from the prompt text the generation continues (the
generation prompt, or a continued final assistant message). :func:`close_text` is the text the
host writes to end a block whose thinking budget is spent.

Splitting rules (the same whatever the pieces: only the whole text decides):

* the block counts only at the start of the output (whitespace before ``<think>`` allowed):
  any other text first means the model answered without thinking, and a later ``<think>`` is
  answer text, as llama-server parses it;
* no closing tag at all: everything after ``<think>`` is reasoning;
* whitespace around the reasoning and at the start of the answer is dropped (the
  ``\\n\\n`` between ``</think>`` and the answer is the template's, not the answer's).
"""

from __future__ import annotations

import enum
from typing import Callable

from hydra_node.inference.capabilities import REASONING_FORMATS, ModelCaps

__all__ = [
    "THINK_OPEN",
    "THINK_CLOSE",
    "REASONING_OVERRIDES",
    "Phase",
    "detect",
    "close_text",
    "ReasoningSplitter",
]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
#: gpt-oss (harmony) markers, as the engine renders them (special tokens shown).
CHANNEL, MESSAGE, START = "<|channel|>", "<|message|>", "<|start|>"
_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_MARKERS = (CHANNEL, MESSAGE, START, "<|constrain|>", *_ENDS)
#: ``override`` values of :func:`detect`: "auto" = from the template, else the format itself
#: ("" = treat the model as not reasoning), as llama-server's ``--reasoning-format``.
REASONING_OVERRIDES = ("auto", *REASONING_FORMATS)
_EMPTY_BLOCK = THINK_OPEN + THINK_CLOSE


class Phase(enum.Enum):
    BEFORE = "before"  # nothing decided yet (a think block may still open; gpt-oss: between messages)
    THINKING = "thinking"  # inside the reasoning block
    ANSWER = "answer"  # the answer (a think block closed, or the model answered straight away)


def _squash(text: str) -> str:
    return "".join(text.split())


def _ends_closed(prompt: str) -> bool:
    """The generation prompt ends with a closed, empty think block (thinking off)."""
    return _squash(prompt).endswith(_EMPTY_BLOCK)


def detect(
    template: str | None,
    *,
    render: Callable[[bool | None], str | None] | None = None,
    fim: bool = False,
    override: str = "auto",
) -> ModelCaps:
    """The model's capabilities as far as reasoning goes (``fim`` is passed through).

    ``template``: the GGUF ``tokenizer.chat_template`` (None: the model has none, so it does not
    reason). ``render(thinking)``: the generation prompt of a one-user-message chat rendered with
    ``enable_thinking`` = ``thinking`` (None: not given), or None when the template refuses; with
    it, ``thinks`` and ``switch`` are what the template really renders, without it they are read
    from the source. ``override``: one of :data:`REASONING_OVERRIDES`."""
    if override not in REASONING_OVERRIDES:
        raise ValueError(f"unknown reasoning format {override!r:.40} (one of {', '.join(REASONING_OVERRIDES)})")
    src = template or ""
    if override != "auto":
        fmt = override
    elif CHANNEL in src:
        fmt = "gpt-oss"
    elif THINK_OPEN in src or THINK_CLOSE in src:
        fmt = "think"
    else:
        fmt = ""
    if fmt != "think":  # gpt-oss always reasons (its effort is a template variable, not a switch)
        return ModelCaps(fmt, thinks=bool(fmt), switch=False, fim=fim)
    switch = "enable_thinking" in src
    thinks = True
    if render is not None and src:
        default, on, off = render(None), render(True), render(False)
        if default is not None:
            thinks = not _ends_closed(default)
        switch = switch and on is not None and off is not None and on != off
    return ModelCaps("think", thinks=thinks, switch=switch, fim=fim)


def close_text(fmt: str, phase: Phase) -> str:
    """What the host writes to end the reasoning when the budget is spent in ``phase``
    (BEFORE: the block has not opened yet, and will not: an empty block, then the answer)."""
    if fmt == "think":
        return "\n" + THINK_CLOSE + "\n\n" if phase is Phase.THINKING else THINK_OPEN + "\n\n" + THINK_CLOSE + "\n\n"
    if fmt == "gpt-oss":
        head = "<|end|>" + START + "assistant" if phase is Phase.THINKING else ""
        return head + CHANNEL + "final" + MESSAGE
    raise ValueError(f"format {fmt!r:.40} has no reasoning block")


def _partial_tail(buf: str, words: tuple[str, ...]) -> int:
    """Where the longest suffix of ``buf`` that is a proper prefix of one of ``words`` starts
    (``len(buf)``: none)."""
    best = len(buf)
    for w in words:
        for k in range(min(len(w) - 1, len(buf)), 0, -1):
            if buf.endswith(w[:k]):
                best = min(best, len(buf) - k)
                break
    return best


class ReasoningSplitter:
    """Generated text in, ``(reasoning, answer)`` pieces out; text that could still be part of a
    tag is held back until it is decided (:meth:`flush` at the end gives the rest)."""

    def __init__(self, fmt: str, phase: Phase = Phase.BEFORE, channel: str = ""):
        if fmt not in ("think", "gpt-oss"):
            raise ValueError(f"format {fmt!r:.40} does not reason")
        self.fmt = fmt
        self.phase = phase
        self._buf = ""
        self._started = False  # the current part (reasoning or answer) has shown non-whitespace text
        self._channel = channel or ("analysis" if phase is Phase.THINKING else "final")

    @classmethod
    def start(cls, fmt: str, opening: str, *, continuing: bool = False) -> "ReasoningSplitter":
        """A splitter for output that follows ``opening``: the generation prompt (an open
        ``<think>`` in it: the output starts inside the block; a closed block: the answer), or,
        ``continuing`` a final assistant message, that message as rendered (no tags: the answer
        goes on)."""
        if fmt == "think":
            i, j = opening.rfind(THINK_OPEN), opening.rfind(THINK_CLOSE)
            if i > j:
                s = cls(fmt, Phase.THINKING)
                s._started = bool(opening[i + len(THINK_OPEN) :].strip())
                return s
            if j >= 0 or continuing:
                s = cls(fmt, Phase.ANSWER)
                s._started = bool(opening[j + len(THINK_CLOSE) :].strip()) if j >= 0 else True
                return s
            return cls(fmt, Phase.BEFORE)
        i = opening.rfind(MESSAGE)
        if i >= 0 and not any(m in opening[i:] for m in (*_ENDS, START)):
            head = opening[:i]
            c = head.rfind(CHANNEL)
            channel = head[c + len(CHANNEL) :].split()[0] if c >= 0 and head[c + len(CHANNEL) :].split() else "final"
            s = cls(fmt, Phase.THINKING if channel == "analysis" else Phase.ANSWER, channel)
            s._started = True
            return s
        if continuing:
            return cls(fmt, Phase.ANSWER, "final")
        return cls(fmt, Phase.BEFORE)

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        return self._think(False) if self.fmt == "think" else self._harmony(False)

    def flush(self) -> tuple[str, str]:
        """End of the output: what was held back, decided (an unclosed block is all reasoning)."""
        return self._think(True) if self.fmt == "think" else self._harmony(True)

    # ---- <think> ---------------------------------------------------------------------------
    def _think(self, final: bool) -> tuple[str, str]:
        reasoning, answer = "", ""
        while True:
            if self.phase is Phase.BEFORE:
                s = self._buf.lstrip()
                if s.startswith(THINK_OPEN):
                    self._buf, self.phase, self._started = s[len(THINK_OPEN) :], Phase.THINKING, False
                    continue
                if not final and (not s or THINK_OPEN.startswith(s)):
                    return reasoning, answer  # whitespace, or the start of the tag: undecided
                self.phase, self._started = Phase.ANSWER, False
                continue
            if self.phase is Phase.THINKING:
                if not self._started:
                    self._buf = self._buf.lstrip()
                    if not self._buf:
                        return reasoning, answer
                    self._started = True
                i = self._buf.find(THINK_CLOSE)
                if i >= 0:
                    reasoning += self._buf[:i].rstrip()
                    self._buf, self.phase, self._started = self._buf[i + len(THINK_CLOSE) :], Phase.ANSWER, False
                    continue
                if final:
                    reasoning += self._buf.rstrip()
                    self._buf = ""
                    return reasoning, answer
                cut = _partial_tail(self._buf, (THINK_CLOSE,))
                cut = len(self._buf[:cut].rstrip())  # trailing whitespace waits: it may precede the tag
                reasoning += self._buf[:cut]
                self._buf = self._buf[cut:]
                return reasoning, answer
            if not self._started:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    return reasoning, answer
                self._started = True
            answer += self._buf
            self._buf = ""
            return reasoning, answer

    # ---- gpt-oss channels -------------------------------------------------------------------
    def _harmony(self, final: bool) -> tuple[str, str]:
        reasoning, answer = "", ""

        def out(text: str) -> None:
            nonlocal reasoning, answer
            if self._channel == "analysis":
                reasoning += text
            else:
                answer += text

        while True:
            if self.phase is Phase.BEFORE:  # a message header: [<|start|>assistant]<|channel|>NAME ...<|message|>
                i = self._buf.find(MESSAGE)
                if i >= 0:
                    head = self._buf[:i]
                    c = head.rfind(CHANNEL)
                    words = head[c + len(CHANNEL) :].split() if c >= 0 else []
                    self._channel = words[0] if words else "final"
                    self.phase = Phase.THINKING if self._channel == "analysis" else Phase.ANSWER
                    self._buf = self._buf[i + len(MESSAGE) :]
                    continue
                k = self._buf.find("<|")
                pre = (self._buf if k < 0 else self._buf[:k]).strip()
                if pre and pre != "<" and not self._seen_header(pre):
                    self._channel, self.phase = "final", Phase.ANSWER  # plain text first: no channels
                    continue
                if final:
                    self._buf = ""
                return reasoning, answer
            at = [j for m in (*_ENDS, START, CHANNEL) if (j := self._buf.find(m)) >= 0]
            if at:
                j = min(at)
                out(self._buf[:j])
                self._buf, self.phase = self._buf[j:], Phase.BEFORE
                continue
            cut = len(self._buf) if final else _partial_tail(self._buf, _MARKERS)
            out(self._buf[:cut])
            self._buf = self._buf[cut:]
            return reasoning, answer

    @staticmethod
    def _seen_header(s: str) -> bool:
        """Text that a header may hold before its channel (``assistant`` after ``<|start|>``)."""
        return "assistant".startswith(s) or s.startswith("assistant")
