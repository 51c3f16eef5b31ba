"""The continuous-batching slot scheduler (pure: no llama.cpp, no clock, no I/O).

A runner holds ``n_slots`` parallel sequences.  Each slot owns one llama.cpp sequence id;
the KV cache is unified (``n_ctx`` cells shared by every sequence, as llama-server ``-kvu``),
so one request may use up to the whole context.  Every engine step is ONE ``llama_decode``
over a batch of at most ``n_batch`` tokens, planned here:

* every decoding sequence contributes exactly one token (the one it sampled last step);
* the room left goes to prompt prefill in chunks, shared fairly between the sequences still
  prefilling (water-filling, rotating who gets the odd token), so a long prompt is spread
  over several steps and never stalls the streams already decoding;
* a prompt with images holds placeholder ids (negative) at the images' positions
  (:mod:`~hydra_node.runtime.child.engine.media`): a chunk never crosses a boundary between text and
  image positions (it is cut there, and the room left goes to the others as usual), so the engine
  decodes each chunk as one kind of row (token ids, or embeddings); such a prompt must end with a
  text token.  The prompt cache and prefix sharing compare the token lists as they are: a
  placeholder matches only the same image at the same position.

Because ``n_slots <= n_batch`` the room left is always at least the number of prefilling
sequences: every admitted sequence advances at every step.  A sequence finishes with
``"length"`` when it reaches ``max_tokens`` or the context, ``"stop"`` when the
engine says so (end of generation, a stop string), ``"cancelled"`` when cancelled: it leaves
the batch at the next plan.  A released slot remembers the tokens still in its KV cells, so
a new prompt sharing that prefix skips re-evaluating it (the prompt cache), always keeping
at least one token to evaluate so the first sample has logits.  With ``share_prefixes`` a new
prompt may also reuse a prefix held by a slot that is still generating (a shared system prompt,
the same chat continued in parallel): the admission names that slot (``copy_from``) and the
engine copies the cells (``llama_memory_seq_cp``; in the unified cache the cells are shared, not
duplicated) when the shared part is at least ``min_shared_tokens`` and longer than any free
slot's; a request whose prompt starts with what a sequence is still PREFILLING (``n`` siblings, a
burst of one system prompt) waits for those cells (``wait_for``, no prefill of its own) and then
copies them (``StepPlan.copies``), so the shared part is evaluated once.  ``max_cached`` bounds how many free slots keep their prefix (the oldest is dropped).

The prompt cache's tiers (``tiers``, docs/prompt-cache.md): a free slot's cached prefix about to be
lost (evicted, over ``max_cached``, or reused for another prompt) is listed by :meth:`SlotScheduler.take_dropped`
so the engine can save its KV state first; an admission asks ``tiers.lookup`` for a saved state
sharing a longer prefix with the prompt than any slot (by ``min_shared_tokens``) and, when one fits,
plans it restored (``Admission.restore``) into the free slot whose own cache is worth least.

KV budget (total cells, never per slot).  Every admitted sequence holds a *reservation*: its
whole prompt plus ``decode_reserve`` decode cells (fewer if ``max_tokens`` needs fewer).
Reservations plus the cells still cached by free slots never exceed ``n_ctx``, so prefill and
the reserved decode tokens always find room and no sequence's cells are ever overwritten:

* admission is FIFO: the oldest waiting request is admitted when a slot is free AND its
  reservation fits beside the others' (cached prefixes of free slots are evicted to make room,
  only when that makes it fit); until then it and everything behind it wait.  Every sequence
  ends (``max_tokens`` is capped at the context), so the wait always ends: no deadlock;
* a decoding sequence past its reservation takes one free cell per step.  When the cells run
  out (after evicting cached prefixes) the YOUNGEST such sequence (latest admitted) finishes
  with ``"length"`` until the others fit; a sequence within its reservation is never cut.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from hydra_node.runtime.child.engine.media import is_media
from hydra_node.runtime.child.engine.prompt_store import TierHit, common_prefix

from hydra_node.runtime.child.engine.slot_types import (
    MAX_SLOTS,
    Admission,
    DecodeToken,
    Finish,
    PrefillChunk,
    Rejected,
    SlotConfig,
    SlotStatistics,
    StepPlan,
)

__all__ = [
    "MAX_SLOTS",
    "Admission",
    "DecodeToken",
    "PrefillChunk",
    "SlotConfig",
    "SlotScheduler",
    "SlotStatistics",
    "StepPlan",
    "Finish",
    "Rejected",
    "common_prefix",
]


class _Tiers(Protocol):
    def lookup(self, prompt: tuple[int, ...], limit: int, better_than: int) -> TierHit | None: ...


@dataclass
class _Seq:
    rid: int
    prompt: tuple[int, ...]
    max_tokens: int
    slot: int = -1
    prefilled: int = 0
    cancelled: bool = False
    reserved: int = 0  # KV cells this sequence may fill without taking more from the pool
    tokens: list[int] = field(default_factory=list)  # sampled tokens (for the slot's resident prefix)
    #: (source rid, tokens): this sequence shares its first tokens with a sequence still prefilling
    #: them; it is not prefilled itself until they are computed, then copies them (``StepPlan.copies``)
    wait_for: tuple[int, int] | None = None
    #: where the prompt changes between text and image positions (ascending, inside the prompt;
    #: empty for a text prompt): a prefill chunk never spans one (engine/media.py)
    cuts: tuple[int, ...] = ()

    @property
    def generated(self) -> int:
        return len(self.tokens)

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.prompt)

    def run_end(self) -> int:
        """End (exclusive) of the text or image run the next prefill chunk starts in."""
        i = bisect_right(self.cuts, self.prefilled)
        return self.cuts[i] if i < len(self.cuts) else len(self.prompt)

    @property
    def kv_used(self) -> int:
        """Cells this sequence occupies: the prompt evaluated so far and every fed sampled token."""
        return self.prefilled + max(0, self.generated - 1)

    def cached(self) -> tuple[int, ...]:
        """The tokens whose cells are in the KV cache now (positions ``[0, kv_used)``)."""
        return self.prompt[: self.prefilled] + tuple(self.tokens[: max(0, self.generated - 1)])


def _cuts(prompt: Sequence[int]) -> tuple[int, ...]:
    """The positions where ``prompt`` changes between text and image positions (none for text)."""
    if not any(is_media(t) for t in prompt):
        return ()
    return tuple(i for i in range(1, len(prompt)) if is_media(prompt[i]) != is_media(prompt[i - 1]))


class SlotScheduler:
    def __init__(self, config: SlotConfig):
        self.config = config
        self._waiting: deque[_Seq] = deque()
        self._active: dict[int, _Seq] = {}  # rid -> sequence, in admission order
        self._free = list(range(config.n_slots))
        self._resident: list[tuple[int, ...]] = [() for _ in range(config.n_slots)]  # tokens left in a free slot
        self._rotate = 0
        self._steps = 0
        #: rid -> prompt tokens the step planned last prefills (until its commit): a sequence the
        #: engine finishes during that step (its first sample ended it) keeps them as its cached prefix
        self._inflight: dict[int, int] = {}
        self._prefix = [0, 0, 0, 0]  # hits, misses, reused tokens, shared from an active slot (statistics)
        self._freed_at: dict[int, int] = {}  # free slot -> release order (the oldest cache is dropped first)
        self._releases = 0
        self._pending_evictions: list[int] = []  # over max_cached: dropped at the next plan
        #: the prompt cache's tiers (``lookup(prompt, limit, better_than) -> TierHit | None``), or None
        self.tiers: _Tiers | None = None
        self._dropped: list[tuple[int, tuple[int, ...], int]] = []  # (slot, tokens, kept): see take_dropped

    # ---- requests ------------------------------------------------------------------
    def submit(self, rid: int, prompt: Sequence[int], max_tokens: int) -> None:
        if rid in self._active or any(s.rid == rid for s in self._waiting):
            raise Rejected(f"request id {rid} is already running", code="bad_message", status=400)
        if not prompt:
            raise Rejected("the prompt is empty", code="invalid_request", status=400)
        limit = self.config.n_ctx
        if len(prompt) >= limit:
            raise Rejected(
                f"prompt is {len(prompt)} tokens; this model's context is {limit} tokens (ctx_size, "
                f"shared by the runner's parallel sequences)",
                code="context_length_exceeded",
                status=400,
            )
        if len(self._waiting) >= self.config.max_waiting + len(self._free):
            raise Rejected(
                f"runner is full ({self.config.n_slots} slots busy, {len(self._waiting)} waiting)",
                code="queue_full",
                status=429,
            )
        if max_tokens < 1:
            raise Rejected("max_tokens must be at least 1", code="invalid_request", status=400)
        if is_media(prompt[-1]):
            raise Rejected(
                "the prompt ends with an image position; it must end with a text token (the first "
                "sample needs the logits of a text row: put the generation prompt after the image)",
                code="invalid_request",
                status=400,
            )
        cuts = _cuts(prompt)
        self._waiting.append(_Seq(rid, tuple(prompt), min(max_tokens, limit - len(prompt)), cuts=cuts))

    def cancel(self, rid: int) -> bool:
        """Mark ``rid`` cancelled; it leaves at the next :meth:`plan`.  False if unknown."""
        for s in self._waiting:
            if s.rid == rid:
                s.cancelled = True
                return True
        active = self._active.get(rid)
        if active is None:
            return False
        active.cancelled = True
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
        evicted: list[int] = self._pending_evictions
        self._pending_evictions = []
        finished += self._grow(evicted)
        admitted: list[Admission] = []
        while self._waiting and self._free:
            a = self._try_admit(self._waiting[0], evicted)
            if a is None:
                break  # FIFO: the head waits for room, and everything behind it
            self._waiting.popleft()
            admitted.append(a)
        copies = self._resolve_waits()
        decode = tuple(DecodeToken(s.rid, s.slot, s.kv_used) for s in self._active.values() if s.decoding)
        prefill = self._prefill(self.config.n_batch - len(decode))
        self._inflight = {c.rid: c.length for c in prefill}
        return StepPlan(tuple(admitted), tuple(finished), decode, prefill, tuple(evicted), copies)

    def _resolve_waits(self) -> tuple[Admission, ...]:
        """Sequences waiting for a prefix another one prefills: copy it once it is computed; if the
        source left, copy from the free slot still caching it, or prefill from scratch."""
        copies = []
        for s in self._active.values():
            if s.wait_for is None:
                continue
            src_rid, n = s.wait_for
            src = self._active.get(src_rid)
            if src is not None and src.prefilled < n:
                continue  # not computed yet: wait another step
            slot = (
                src.slot
                if src is not None
                else next((x for x in self._free if common_prefix(self._resident[x], s.prompt) >= n), -1)
            )
            s.wait_for = None
            if slot < 0:  # the source left and its cells are gone: a miss, prefill it all
                self._prefix[1] += 1
                continue
            s.prefilled = n
            self._count_hit(n, shared=True)
            copies.append(Admission(s.rid, s.slot, n, slot))
        return tuple(copies)

    # ---- the KV budget ---------------------------------------------------------------
    def _committed(self) -> int:
        """Cells spoken for: active reservations plus the prefixes free slots still cache."""
        return sum(s.reserved for s in self._active.values()) + sum(len(r) for r in self._resident)

    def _evict_one(self, evicted: list[int], keep: int = -1) -> int:
        """Drop the cached cells of one free slot (oldest freed first, never ``keep``); cells freed."""
        for slot in self._free:
            if slot != keep and self._resident[slot]:
                n = len(self._resident[slot])
                self._drop(slot, 0)
                self._resident[slot] = ()
                evicted.append(slot)
                return n
        return 0

    def _grow(self, evicted: list[int]) -> list[tuple[int, Finish]]:
        """Every decoding sequence feeds one token now; one past its reservation needs a free cell.
        Short of cells: evict cached prefixes, then finish the youngest such sequences ("length")."""
        cut: list[tuple[int, Finish]] = []
        while True:
            growers = [s for s in self._active.values() if s.decoding and s.kv_used + 1 > s.reserved]
            if len(growers) <= self.config.n_ctx - self._committed():
                break
            if not self._evict_one(evicted):
                self._release(growers[-1])  # dict order = admission order: the last is the youngest
                cut.append((growers[-1].rid, Finish.LENGTH))
        for s in growers:
            s.reserved = s.kv_used + 1
        return cut

    def _try_admit(self, s: _Seq, evicted: list[int]) -> Admission | None:
        """Admit ``s`` if its reservation fits (evicting other free slots' prefixes if that makes it fit)."""
        best, reused, source, wait = self._pick_slot(s)
        need = len(s.prompt) + min(s.max_tokens - 1, self.config.decode_room)
        hit = None
        if self.tiers is not None and wait is None and self.config.prompt_cache:
            hit = self.tiers.lookup(s.prompt, len(s.prompt) - 1, reused)
            # the whole saved state is loaded before the cells past the common prefix are dropped
            if hit is not None and self._fits(self._coldest(), max(need, hit.n_tokens)):
                best, reused, source, need = self._coldest(), hit.common, -1, max(need, hit.n_tokens)
            else:
                hit = None
        if not self._fits(best, need):
            return None
        room = self.config.n_ctx - self._committed() + len(self._resident[best])  # best's cells become s's
        while room < need:
            room += self._evict_one(evicted, keep=best)
        s.reserved = need
        s.wait_for = wait
        return self._admit(s, best, reused, source, hit)

    def _fits(self, slot: int, need: int) -> bool:
        """``need`` cells fit in ``slot`` (its own cells and other free slots' may be evicted)."""
        room = self.config.n_ctx - self._committed() + len(self._resident[slot])
        return room + sum(len(self._resident[x]) for x in self._free if x != slot) >= need

    def _coldest(self) -> int:
        """The free slot whose cache is worth least: an empty one, else the one freed longest ago."""
        empty = [x for x in self._free if not self._resident[x]]
        return empty[0] if empty else min(self._free, key=lambda x: self._freed_at.get(x, -1))

    def _prefill(self, room: int) -> tuple[PrefillChunk, ...]:
        needy = [s for s in self._active.values() if not s.decoding and s.wait_for is None]
        if not needy:
            return ()
        k = self._rotate % len(needy)
        needy = needy[k:] + needy[:k]
        self._rotate += 1
        take = {s.rid: 0 for s in needy}
        # a chunk ends at the end of its run (text or image positions), so it is one kind of row
        want = {s.rid: s.run_end() - s.prefilled for s in needy}
        while room > 0:
            open_ = [s for s in needy if take[s.rid] < want[s.rid]]
            if not open_:
                break
            share = max(1, room // len(open_))
            for s in open_:
                n = min(share, want[s.rid] - take[s.rid], room)
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
        self._inflight = {}
        for c in plan.prefill:
            s = self._active.get(c.rid)
            if s is not None:
                s.prefilled += c.length
        out = []
        for rid, tok in sampled.items():
            s = self._active.get(rid)
            if s is None:
                continue
            s.tokens.append(tok)
            if s.generated >= s.max_tokens or len(s.prompt) + s.generated >= self.config.n_ctx:
                self._release(s)
                out.append((rid, Finish.LENGTH))
        return out

    def finish(self, rid: int, decoded: bool = True) -> None:
        """The engine ended ``rid`` itself (end of generation, a stop string): free its slot.  Called
        during a step, after its decode (``decoded``), the prompt tokens the step prefilled for ``rid``
        are in its cells and stay cached; ``decoded=False``: the step's decode did not run for it."""
        s = self._active.get(rid)
        if s is not None:
            n = self._inflight.pop(rid, 0)
            if decoded:
                s.prefilled += n
            self._release(s)

    # ---- slots -----------------------------------------------------------------------
    def _pick_slot(self, s: _Seq) -> tuple[int, int, int, tuple[int, int] | None]:
        """(slot, prefix tokens to reuse, source slot or -1, wait): the free slot caching the longest
        prefix of ``s``'s prompt, or, when a slot still generating holds a longer one (``share_prefixes``,
        at least ``min_shared_tokens``), a free slot to copy that prefix into; when a sequence still
        PREFILLING will hold a longer one (the siblings of an ``n`` > 1 request, a burst of one system
        prompt), ``wait = (its rid, tokens)``: copy them once computed instead of computing them twice."""
        limit = len(s.prompt) - 1  # evaluate at least one token: the first sample needs logits
        best, reused = self._free[0], 0
        if not self.config.prompt_cache:
            return best, 0, -1, None
        for slot in self._free:
            n = common_prefix(self._resident[slot], s.prompt)
            if n > reused:
                best, reused = slot, n
        reused = min(reused, limit)
        source, shared, waited, future = -1, 0, -1, 0
        if self.config.share_prefixes:
            for other in self._active.values():
                n = min(common_prefix(other.cached(), s.prompt), limit)
                if n > shared:
                    source, shared = other.slot, n
                if other.wait_for is None and not other.decoding:  # still prefilling: what it will hold
                    m = min(common_prefix(other.prompt, s.prompt), limit)
                    if m > future:
                        waited, future = other.rid, m
        floor = max(reused, self.config.min_shared_tokens - 1)
        if max(shared, future) <= floor:
            return best, reused, -1, None
        # copy into the free slot whose own cache is worth least: an empty one, else the oldest
        dest = self._coldest()
        if future > shared:
            return dest, 0, -1, (waited, future)
        return dest, shared, source, None

    def _admit(self, s: _Seq, best: int, reused: int, source: int = -1, hit: TierHit | None = None) -> Admission:
        self._free.remove(best)
        self._freed_at.pop(best, None)
        self._drop(best, reused if source < 0 and hit is None else 0)  # what it held past ``reused`` is lost
        self._resident[best] = ()
        s.slot, s.prefilled = best, reused
        if reused:
            self._count_hit(reused, shared=source >= 0)
        elif s.wait_for is None:  # a waiting sequence is counted when its wait resolves
            self._prefix[1] += 1
        self._active[s.rid] = s
        return Admission(s.rid, best, reused, source, hit)

    def _count_hit(self, reused: int, *, shared: bool) -> None:
        self._prefix[0] += 1
        self._prefix[2] += reused
        self._prefix[3] += 1 if shared else 0

    def _release(self, s: _Seq) -> None:
        del self._active[s.rid]
        # the cells stay in the KV cache until evicted or re-used, so they count against the budget
        # even without the prompt cache (which only decides whether a new prompt may reuse them)
        self._resident[s.slot] = s.cached()
        self._free.append(s.slot)
        self._releases += 1
        self._freed_at[s.slot] = self._releases
        cap = self.config.max_cached
        if cap is not None:
            cached = sorted((x for x in self._free if self._resident[x]), key=lambda x: self._freed_at.get(x, -1))
            for slot in cached[: max(0, len(cached) - cap)]:
                self._drop(slot, 0)
                self._resident[slot] = ()
                self._pending_evictions.append(slot)

    def resident(self, slot: int) -> tuple[int, ...]:
        """Tokens a free slot still holds in its KV cells (the engine keeps cells ``[0, len)``)."""
        return self._resident[slot]

    # ---- KV state export and import (docs/kv-reuse.md) ----------------------------------
    def holding(self, tokens: Sequence[int]) -> int:
        """A free slot whose cached cells start with ``tokens``, its cache cut to exactly them (the
        engine drops its cells past ``len(tokens)``); -1 when no free slot holds them."""
        n = len(tokens)
        for slot in self._free:
            if n and len(self._resident[slot]) >= n and common_prefix(self._resident[slot], tokens) == n:
                self._resident[slot] = self._resident[slot][:n]
                return slot
        return -1

    def adopt(self, tokens: Sequence[int]) -> tuple[int, list[int]]:
        """A free slot to hold ``tokens`` as its cached prefix (imported KV cells), so the prompt cache
        serves the next prompt that starts with them: (the slot, the free slots whose cached cells the
        engine must drop first, the slot itself among them).  :class:`Rejected` when the prompt cache
        is off, no slot is free (503, retry) or the cells cannot fit beside the reservations."""
        n, cap = len(tokens), self.config.max_cached
        if not self.config.prompt_cache or cap == 0:
            raise Rejected(
                "this runner keeps no cached prefixes (prompt_cache off or max_entries 0)",
                code="prompt_cache_disabled",
                status=409,
            )
        if n >= self.config.n_ctx:
            raise Rejected(
                f"the state holds {n} tokens; this runner's context is {self.config.n_ctx}",
                code="context_length_exceeded",
                status=400,
            )
        if not self._free:
            raise Rejected("every slot is busy", code="no_free_slot", status=503)
        dest = self._coldest()
        evicted = [dest] if self._resident[dest] else []
        mark = len(self._dropped)  # an import drops these cells at once, before the engine could save them
        room = self.config.n_ctx - self._committed() + len(self._resident[dest])
        if room + sum(len(self._resident[x]) for x in self._free if x != dest) < n:
            raise Rejected(
                f"{n} cells do not fit beside the running sequences' reservations", code="no_free_slot", status=503
            )
        self._resident[dest] = ()
        while room < n:
            room += self._evict_one(evicted, keep=dest)
        if dest in self._pending_evictions:  # it must not be dropped at the next plan
            self._pending_evictions.remove(dest)
        self._resident[dest] = tuple(tokens)
        self._releases += 1
        self._freed_at[dest] = self._releases
        if cap is not None:  # the newest cache: over the cap, the oldest others go
            cached = sorted(
                (x for x in self._free if self._resident[x] and x != dest), key=lambda x: self._freed_at.get(x, -1)
            )
            for slot in cached[: max(0, len(cached) + 1 - cap)]:
                self._resident[slot] = ()
                evicted.append(slot)
        gone = {dest, *evicted}  # their cells are replaced or dropped now: nothing of theirs to save
        self._dropped = [d for d in self._dropped[:mark] if d[0] not in gone]
        return dest, evicted

    def forget(self, slot: int) -> None:
        """A free slot's cells could not be loaded: it holds nothing."""
        if slot in self._free:
            self._resident[slot] = ()
            self._dropped = [d for d in self._dropped if d[0] != slot]

    def drop_all(self) -> list[int]:
        """Forget every sequence, waiting or active (a failed engine step); returns their ids."""
        rids = [s.rid for s in self._waiting] + list(self._active)
        self._waiting.clear()
        self._active.clear()
        self._free = list(range(self.config.n_slots))
        self.forget_resident()
        return rids

    def forget_resident(self) -> list[int]:
        """The KV cells of free slots can no longer be trusted (cleared, or a failed decode): the
        slots that still held some, whose cells the engine must drop unless it clears the cache."""
        held = sorted({slot for slot, r in enumerate(self._resident) if r} | set(self._pending_evictions))
        self._resident = [() for _ in range(self.config.n_slots)]
        self._pending_evictions = []
        self._dropped = []  # nothing left worth saving
        return held

    # ---- the prompt cache's tiers (docs/prompt-cache.md) ---------------------------------
    def _drop(self, slot: int, kept: int) -> None:
        """``slot``'s cached cells past ``kept`` are about to be lost: listed for the tiers."""
        held = self._resident[slot]
        if self.tiers is not None and len(held) > kept:
            self._dropped.append((slot, held, kept))

    def take_dropped(self) -> list[tuple[int, tuple[int, ...], int]]:
        """(slot, tokens its cells hold, how many of them it keeps) of every free slot whose cached
        prefix the last :meth:`plan` gave up, in order; their cells are intact until the engine acts on
        the plan, so it saves them first."""
        out, self._dropped = self._dropped, []
        return out

    def unrestore(self, rid: int) -> None:
        """``rid``'s planned restore failed: its slot is empty, its prompt is prefilled from the start."""
        s = self._active.get(rid)
        if s is not None:
            s.prefilled = 0

    def held(self) -> list[tuple[int, tuple[int, ...]]]:
        """(slot, tokens) of every free slot that holds a cached prefix (the runner stops: save them)."""
        return [(x, self._resident[x]) for x in self._free if self._resident[x]]

    def statistics(self) -> SlotStatistics:
        return SlotStatistics(
            active=len(self._active),
            waiting=len(self._waiting),
            kv_used=sum(s.kv_used for s in self._active.values()),
            kv_total=self.config.n_ctx,
            kv_reserved=self._committed(),
            steps=self._steps,
            prefix_hits=self._prefix[0],
            prefix_misses=self._prefix[1],
            prefix_reused_tokens=self._prefix[2],
            prefix_shared=self._prefix[3],
        )

    def kv_by_slot(self) -> dict[int, int]:
        return {s.slot: s.kv_used for s in self._active.values()}

    @property
    def idle(self) -> bool:
        return not self._active and not self._waiting
