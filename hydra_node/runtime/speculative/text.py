"""Pure text assembly: token bytes in, safe text deltas out, stop sequences honoured.

A delta never ends inside a UTF-8 character, and text that could be the start of a
stop sequence is held back until it is known not to be one.
"""

from __future__ import annotations

import codecs
from typing import Sequence


class TextAssembler:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._stop = tuple(s for s in stop if s)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded, not yet emitted
        self.stopped = False

    def feed(self, data: bytes) -> str:
        """Add the bytes of one token; return the text that may be emitted now."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            out, self._pending = self._pending[: min(hits)], ""
            return out
        hold = self._held_back()
        out = self._pending[: len(self._pending) - hold]
        self._pending = self._pending[len(out):]
        return out

    def flush(self) -> str:
        """The rest of the text at the end of generation (nothing after a stop)."""
        if self.stopped:
            return ""
        out = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return out

    def _held_back(self) -> int:
        """Length of the longest suffix of the pending text that starts some stop sequence."""
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:n]):
                    best = n
                    break
        return best
