"""Incremental detokenisation with stop sequences (pure).

Bytes from the tokenizer arrive one token at a time and may split a UTF-8
character; stop strings may span tokens.  :class:`TextAssembler` turns pieces into
text deltas that are safe to send: it never emits a partial character nor text
that could still turn out to be the beginning of a stop sequence.
"""

from __future__ import annotations

import codecs


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
        self._pending = self._pending[len(self._pending) - hold:]
        return out

    def flush(self) -> str:
        """End of generation: whatever is held back (no stop matched) is real text."""
        if self.stopped:
            return ""
        out = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return out
