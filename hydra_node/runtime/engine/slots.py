"""The continuous-batching slot scheduler (pure: no llama.cpp, no clock, no I/O).

A runner holds ``n_slots`` parallel sequences.  Each slot owns one llama.cpp sequence id
and a fixed share of the KV cache, ``ctx_per_slot`` cells (as llama-server ``-c N -np P``:
every slot gets ``N / P``).  Every engine step is ONE ``llama_decode`` over a batch of at
most ``n_batch`` tokens, planned here:

* every decoding sequence contributes exactly one token (the one it sampled last step);
* the room left goes to prompt prefill in chunks, shared fairly between the sequences still
  prefilling (water-filling, rotating who gets the odd token), so a long prompt is spread
  over several steps and never stalls the streams already decoding.

Because ``n_slots <= n_batch`` the room left is always at least the number of prefilling
sequences: every admitted sequence advances at every step.  A sequence finishes with
``"length"`` when it reaches ``max_tokens`` or fills its slot's context, ``"stop"`` when the
engine says so (end of generation, a stop string), ``"cancelled"`` when cancelled: it leaves
the batch at the next plan.  A released slot remembers the tokens still in its KV cells, so
a new prompt sharing that prefix skips re-evaluating it (the prompt cache), always keeping
at least one token to evaluate so the first sample has logits.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["Admission", "DecodeToken", "PrefillChunk", "SlotConfig", "SlotScheduler", "SlotStatistics",
           "StepPlan", "Finish", "Rejected"]

#: Most parallel sequences one runner may hold (llama.cpp's LLAMA_MAX_SEQ is 256; 64 keeps
#: per-step bookkeeping small and matches the config bound).
MAX_SLOTS = 64


class Finish(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"


class Rejected(Exception):
    """A request the scheduler cannot take: ``code`` and ``status`` say why (the runner's error frame)."""

    def __init__(self, message: str, *, code: str, status: int):
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass(frozen=True)
class SlotConfig:
    n_slots: int
    n_batch: int
    ctx_per_slot: int
    max_waiting: int = 16  # requests waiting for a free slot inside the child (the node admits n_slots)
    prompt_cache: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.n_slots <= MAX_SLOTS:
            raise ValueError(f"n_slots must be between 1 and {MAX_SLOTS}, not {self.n_slots}")
        if self.n_batch < self.n_slots:
            raise ValueError(f"n_batch ({self.n_batch}) must be at least n_slots ({self.n_slots}): "
                             "every decoding sequence needs one batch row per step")
        if self.ctx_per_slot < 2:
            raise ValueError(f"ctx_per_slot must be at least 2, not {self.ctx_per_slot}")
        if self.max_waiting < 0:
            raise ValueError("max_waiting must not be negative")


@dataclass(frozen=True)
class Admission:
    """``rid`` took ``slot``; its first ``reused`` prompt tokens are already in the slot's KV."""
    rid: int
    slot: int
    reused: int


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens ``[start, start + length)`` of ``rid``, at positions ``start...``; ``last``
    means the chunk ends the prompt, so its final row needs logits (the first sample)."""
    rid: int
    slot: int
    start: int
    length: int
    last: bool


@dataclass(frozen=True)
class DecodeToken:
    """Feed ``rid``'s latest sampled token at position ``pos``; its row needs logits."""
    rid: int
    slot: int
    pos: int


@dataclass(frozen=True)
class StepPlan:
    admitted: tuple[Admission, ...] = ()
    finished: tuple[tuple[int, Finish], ...] = ()  # left before this step (cancelled)
    decode: tuple[DecodeToken, ...] = ()
    prefill: tuple[PrefillChunk, ...] = ()

    @property
    def n_tokens(self) -> int:
        return len(self.decode) + sum(c.length for c in self.prefill)

    @property
    def empty(self) -> bool:
        return self.n_tokens == 0


@dataclass(frozen=True)
class SlotStatistics:
    active: int
    waiting: int
    kv_used: int
    kv_total: int
    steps: int


@dataclass
class _Seq:
    rid: int
    prompt: tuple[int, ...]
    max_tokens: int
    slot: int = -1
    prefilled: int = 0
    generated: int = 0
    cancelled: bool = False
    tokens: list[int] = field(default_factory=list)  # sampled tokens (for the slot's resident prefix)

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.prompt)

    @property
    def kv_used(self) -> int:
        """Cells this sequence occupies: the prompt evaluated so far and every fed sampled token."""
        return self.prefilled + max(0, self.generated - 1)


class SlotScheduler:
    def __init__(self, config: SlotConfig):
        self.config = config
        self._waiting: deque[_Seq] = deque()
        self._active: dict[int, _Seq] = {}  # rid -> sequence, in admission order
        self._free = list(range(config.n_slots))
        self._resident: list[tuple[int, ...]] = [() for _ in range(config.n_slots)]  # tokens left in a free slot
        self._rotate = 0
        self._steps = 0

    # ---- requests ------------------------------------------------------------------
    def submit(self, rid: int, prompt: Sequence[int], max_tokens: int) -> None:
        if rid in self._active or any(s.rid == rid for s in self._waiting):
            raise Rejected(f"request id {rid} is already running", code="bad_message", status=400)
        if not prompt:
            raise Rejected("the prompt is empty", code="invalid_request", status=400)
        limit = self.config.ctx_per_slot
        if len(prompt) >= limit:
            raise Rejected(f"prompt is {len(prompt)} tokens; this runner's per-slot context is {limit} tokens "
                           f"(ctx_size / parallel)", code="context_length_exceeded", status=400)
        if len(self._waiting) >= self.config.max_waiting + len(self._free):
            raise Rejected(f"runner is full ({self.config.n_slots} slots busy, {len(self._waiting)} waiting)",
                           code="queue_full", status=429)
        if max_tokens < 1:
            raise Rejected("max_tokens must be at least 1", code="invalid_request", status=400)
        self._waiting.append(_Seq(rid, tuple(prompt), min(max_tokens, limit - len(prompt))))

    def cancel(self, rid: int) -> bool:
        """Mark ``rid`` cancelled; it leaves at the next :meth:`plan`.  False if unknown."""
        for s in self._waiting:
            if s.rid == rid:
                s.cancelled = True
                return True
        s = self._active.get(rid)
        if s is None:
            return False
        s.cancelled = True
        return True

    def is_active(self, rid: int) -> bool:
        return rid in self._active

    def prompt_of(self, rid: int) -> tuple[int, ...]:
        return self._active[rid].prompt

    # ---- one step --------------------------------------------------------------------
    def plan(self) -> StepPlan:
        finished: list[tuple[int, Finish]] = []
        for s in [s for s in self._waiting if s.cancelled]:
            self._waiting.remove(s)
            finished.append((s.rid, Finish.CANCELLED))
        for s in [s for s in self._active.values() if s.cancelled]:
            self._release(s)
            finished.append((s.rid, Finish.CANCELLED))
        admitted = [self._admit(self._waiting.popleft()) for _ in range(min(len(self._free), len(self._waiting)))]
        decode = tuple(DecodeToken(s.rid, s.slot, s.kv_used) for s in self._active.values() if s.decoding)
        return StepPlan(tuple(admitted), tuple(finished), decode, self._prefill(self.config.n_batch - len(decode)))

    def _prefill(self, room: int) -> tuple[PrefillChunk, ...]:
        needy = [s for s in self._active.values() if not s.decoding]
        if not needy:
            return ()
        k = self._rotate % len(needy)
        needy = needy[k:] + needy[:k]
        self._rotate += 1
        take = {s.rid: 0 for s in needy}
        while room > 0:
            open_ = [s for s in needy if take[s.rid] < len(s.prompt) - s.prefilled]
            if not open_:
                break
            share = max(1, room // len(open_))
            for s in open_:
                n = min(share, len(s.prompt) - s.prefilled - take[s.rid], room)
                take[s.rid] += n
                room -= n
                if room == 0:
                    break
        chunks = []
        for s in needy:
            n = take[s.rid]
            if n:
                chunks.append(PrefillChunk(s.rid, s.slot, s.prefilled, n, s.prefilled + n == len(s.prompt)))
        return tuple(chunks)

    def commit(self, plan: StepPlan, sampled: dict[int, int]) -> list[tuple[int, Finish]]:
        """The step ran: advance prefill, count each sampled token (``rid -> token``, for
        every row that had logits).  Returns the sequences that hit ``"length"`` (released)."""
        self._steps += 1
        for c in plan.prefill:
            s = self._active.get(c.rid)
            if s is not None:
                s.prefilled += c.length
        out = []
        for rid, tok in sampled.items():
            s = self._active.get(rid)
            if s is None:
                continue
            s.generated += 1
            s.tokens.append(tok)
            if s.generated >= s.max_tokens or len(s.prompt) + s.generated >= self.config.ctx_per_slot:
                self._release(s)
                out.append((rid, Finish.LENGTH))
        return out

    def finish(self, rid: int) -> None:
        """The engine ended ``rid`` itself (end of generation, a stop string): free its slot."""
        s = self._active.get(rid)
        if s is not None:
            self._release(s)

    # ---- slots -----------------------------------------------------------------------
    def _admit(self, s: _Seq) -> Admission:
        best, reused = self._free[0], 0
        if self.config.prompt_cache:
            for slot in self._free:
                n = _common_prefix(self._resident[slot], s.prompt)
                if n > reused:
                    best, reused = slot, n
        reused = min(reused, len(s.prompt) - 1)  # evaluate at least one token: the first sample needs logits
        self._free.remove(best)
        self._resident[best] = ()
        s.slot, s.prefilled = best, reused
        self._active[s.rid] = s
        return Admission(s.rid, best, reused)

    def _release(self, s: _Seq) -> None:
        del self._active[s.rid]
        fed = (s.prompt[: s.prefilled] + tuple(s.tokens[: max(0, s.generated - 1)]))
        self._resident[s.slot] = fed if self.config.prompt_cache else ()
        self._free.append(s.slot)

    def resident(self, slot: int) -> tuple[int, ...]:
        """Tokens a free slot still holds in its KV cells (the engine keeps cells ``[0, len)``)."""
        return self._resident[slot]

    def drop_all(self) -> list[int]:
        """Forget every sequence, waiting or active (a failed engine step); returns their ids."""
        rids = [s.rid for s in self._waiting] + list(self._active)
        self._waiting.clear()
        self._active.clear()
        self._free = list(range(self.config.n_slots))
        self.forget_resident()
        return rids

    def forget_resident(self) -> None:
        """The KV cells of free slots can no longer be trusted (cleared, or a failed decode)."""
        self._resident = [() for _ in range(self.config.n_slots)]

    def statistics(self) -> SlotStatistics:
        return SlotStatistics(active=len(self._active), waiting=len(self._waiting),
                              kv_used=sum(s.kv_used for s in self._active.values()),
                              kv_total=self.config.n_slots * self.config.ctx_per_slot, steps=self._steps)

    def kv_by_slot(self) -> dict[int, int]:
        return {s.slot: s.kv_used for s in self._active.values()}

    @property
    def idle(self) -> bool:
        return not self._active and not self._waiting


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
