"""Incremental detokenisation with stop sequences, and the trigger words of a lazy grammar (pure).

Bytes from the tokenizer arrive one token at a time and may split a UTF-8
character; stop strings may span tokens.  :class:`TextAssembler` turns pieces into
text deltas that are safe to send: it never emits a partial character nor text
that could still turn out to be the beginning of a stop sequence.  :class:`TriggerWatch`
finds where a lazy grammar's trigger word first appears in the generated tokens.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


class TextAssembler:
    def __init__(self, stop: tuple[str, ...] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._pending = ""  # decoded but not yet emitted (may be a stop prefix)
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; return text that can be emitted now."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(piece)
        if not self._stop:
            out, self._pending = self._pending, ""
            return out
        cut = -1
        for s in self._stop:
            i = self._pending.find(s)
            if i != -1 and (cut == -1 or i < cut):
                cut = i
        if cut != -1:
            out = self._pending[:cut]
            self._pending = ""
            self.stopped = True
            return out
        hold = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self._pending)), 0, -1):
                if self._pending.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        out = self._pending[: len(self._pending) - hold]
        self._pending = self._pending[len(self._pending) - hold :]
        return out

    def flush(self) -> str:
        """End of generation: whatever is held back (no stop matched) is real text."""
        if self.stopped:
            return ""
        out = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return out


class TextSkip:
    """Drops the first ``n`` characters of a stream of text pieces (pure): what a resumed generation's
    client already received (``resume_skip``), so the text assembler may be fed the resumed tokens
    again (a stop sequence across the cut still matches, held-back text comes back) without
    sending their text twice.  Characters are Python ``str`` characters (code points)."""

    def __init__(self, n: int = 0):
        if n < 0:
            raise ValueError(f"cannot skip {n} characters")
        self.left = n

    def __call__(self, text: str) -> str:
        if self.left <= 0:
            return text
        cut = min(self.left, len(text))
        self.left -= cut
        return text[cut:]


@dataclass(frozen=True)
class Trigger:
    """Where a lazy grammar starts: the text from the trigger word on is ``lead`` (the tail of
    the token the word starts inside; empty when it starts on a token boundary) followed by
    the pieces of ``tokens`` (the rest of the tokens, the one just sampled last)."""

    word: str
    lead: bytes
    tokens: tuple[int, ...]


class TriggerWatch:
    """Watches generated tokens for the first trigger word of a lazy grammar (pure).

    :meth:`find` asks whether one more token would complete a trigger word (without keeping
    it); :meth:`commit` keeps a token that did not.  Only the latest bytes that could still be
    the beginning of a word are kept."""

    def __init__(self, words: tuple[str, ...]):
        if not words or not all(words):
            raise ValueError("a trigger watch needs non-empty words")
        self._words = tuple((w, w.encode("utf-8")) for w in words)
        self._keep = max(len(b) for _, b in self._words) - 1
        self._recent: list[tuple[int, bytes]] = []  # (token, piece), covering the last _keep bytes at least

    def find(self, tok: int, piece: bytes) -> Trigger | None:
        seq = [*self._recent, (tok, piece)]
        text = b"".join(p for _, p in seq)
        hits = [(i, w) for w, b in self._words if (i := text.find(b)) != -1]
        if not hits:
            return None
        at, word = min(hits, key=lambda h: h[0])  # the earliest start; ties: the first word given
        off = 0
        for k, (t, p) in enumerate(seq):
            if at < off + len(p):
                if at == off:
                    return Trigger(word, b"", tuple(x for x, _ in seq[k:]))
                return Trigger(word, p[at - off :], tuple(x for x, _ in seq[k + 1 :]))
            off += len(p)
        raise AssertionError("unreachable: the word lies inside the text")

    def commit(self, tok: int, piece: bytes) -> None:
        self._recent.append((tok, piece))
        total = sum(len(p) for _, p in self._recent)
        while self._recent and total - len(self._recent[0][1]) >= self._keep:
            total -= len(self._recent.pop(0)[1])
