"""The slot scheduler with what speculation needs (pure: no llama.cpp, no clock, no I/O).

A speculating sequence feeds its last token plus ``k`` draft tokens in one step and may keep
``a + 1`` tokens (``a`` accepted drafts, then the target's own).  The plain scheduler
(:mod:`~hydra_node.runtime.child.engine.slots`) reserves one cell per decoding sequence per step; this
subclass says how many draft tokens fit (:meth:`SpeculativeSlots.draft_room`: the request's
``max_tokens``, the context, and the KV cells of its reservation plus the free pool, so the
verify rows never overwrite another sequence's cells) and records the accepted drafts
(:meth:`SpeculativeSlots.accept`) before :meth:`~SlotScheduler.commit` adds the last token.
"""

from __future__ import annotations

from typing import Sequence

from hydra_node.runtime.child.engine.slots import SlotScheduler

__all__ = ["SpeculativeSlots"]


class SpeculativeSlots(SlotScheduler):
    def draft_room(self, rid: int) -> int:
        """Most draft tokens ``rid`` may verify this step (0: none), planned before the batch."""
        s = self._active.get(rid)
        if s is None or not s.decoding or s.cancelled:
            return 0
        # a round emits up to k + 1 tokens; the token fed now already counts as generated
        left = s.max_tokens - s.generated - 1
        ctx = self.config.n_ctx - len(s.prompt) - s.generated - 1
        # cells: this step writes kv_used .. kv_used + k; _grow made kv_used + 1 fit
        cells = (s.reserved - (s.kv_used + 1)) + (self.config.n_ctx - self._committed())
        return max(0, min(left, ctx, cells))

    def slot_of(self, rid: int) -> int:
        return self._active[rid].slot

    def committed(self, rid: int) -> tuple[int, ...]:
        """Prompt and every generated token of ``rid`` (the last one is fed at the next step)."""
        s = self._active[rid]
        return s.prompt + tuple(s.tokens)

    def accept(self, rid: int, tokens: Sequence[int]) -> None:
        """``rid`` kept these draft tokens this step (its cells are in the cache); the step's last
        token follows through :meth:`commit`.  The reservation grows to cover the kept cells."""
        s = self._active[rid]
        s.tokens.extend(int(t) for t in tokens)
        s.reserved = max(s.reserved, s.kv_used + 1)
