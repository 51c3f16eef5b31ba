"""The continuous-batching engine: many sequences, one ``llama_decode`` per step.

Runs inside the runner child (:mod:`hydra_node.runtime.child.main`), on the main thread.
The plan of every step comes from the pure :class:`~hydra_node.runtime.child.engine.slots.SlotScheduler`;
this module turns it into one ``llama_batch`` (every decoding sequence's last token, then
prefill chunks), calls ``llama_decode`` once, samples each row that has logits with that
sequence's native sampler chain (:mod:`hydra_node.runtime.child.engine.sampler`: logit bias,
penalties, grammar, temperature...), detokenises incrementally
(:class:`~hydra_node.runtime.child.textstream.TextAssembler`) and sends ``delta``/``done``/``error``
frames through ``send``.  A request that asks for ``logprobs`` gets one entry per generated token
(:mod:`hydra_node.runtime.child.engine.logprobs`) in its delta frames, ``"logprobs": [entry, ...]``; the
entries of tokens whose text is held back (a possible stop sequence, part of a UTF-8 character)
ride with the next delta, or with the final flush (a delta whose text may be empty).  So a
request's entries number its ``completion_tokens``.  Every delta frame also carries ``"tokens"``: the
ids of the tokens fed to the text assembler since the previous delta (end-of-generation never), so a
request's deltas together hold exactly its ``completion_tokens`` ids, and their text is the streamed
text: what a continuation elsewhere resumes from (``resume_tokens``, :meth:`BatchEngine.submit`).

KV cache: the model's ``llama_cpp.Llama`` object keeps loading, tokenising and chat
templates; its context is replaced by one made for ``n_slots`` sequences.  The cache is
unified (``kv_unified = true``, one buffer of ``n_ctx`` cells shared by the sequences; llama.cpp
then gives every sequence ``llama_n_ctx_seq = n_ctx``), so one request may use the whole
context, as llama-server ``-kvu``.  The slot scheduler budgets the TOTAL cells (reservations,
FIFO admission, the youngest over-reservation decoder cut with "length" when full: see
:mod:`~hydra_node.runtime.child.engine.slots`), so ``llama_decode`` always finds room and no
sequence's cells are overwritten; the engine drops the cells the plan evicts (first saving, with the
prompt cache's tiers attached, the prefixes the plan gives up, and restoring the admissions it plans
from a tier hit: :mod:`~hydra_node.runtime.child.engine.prompt_tiers`, docs/prompt-cache.md).  Why unified:
measured on this CPU with the bundled model, a decode step of 8 sequences costs 88 ms of CPU
with a unified cache and 142 ms with one stream per sequence (1 sequence: 16-17 ms either
way), so the split layout would throw most of batching's gain away.  Sequence id = slot index.

Speculation (``speculation``: :class:`~hydra_node.runtime.child.engine.speculation.EngineSpeculation`,
a runner with a draft): one greedy sequence's draft tokens ride in the same batch as everyone
else's rows, verified there; the accepted ones are emitted in the same step (docs/speculative.md).

Images (docs/vision.md): a prompt may hold placeholder ids (negative) where an image stands
(:mod:`~hydra_node.runtime.child.engine.media`); the runner that loaded a projector gives the engine
its :class:`~hydra_node.runtime.child.engine.media.MediaRows` (:meth:`BatchEngine.attach_media`),
without which such a prompt is refused at submit (400 ``unsupported_parameter``).  The scheduler
never mixes text and image positions in one prefill chunk, so a step's image chunks go into a second
``llama_batch``, of embeddings (``embd`` rows from ``MediaRows.rows``, no logits), decoded just
before the token batch: one more ``llama_decode`` only in steps that have image rows, and the
token batch's logits are the step's.  A sequence with images is never speculated (a draft has no
projector), its repeat-penalty window holds its prompt's text tokens only (llama-server skips its
media positions too), and its prompt must end with a text token (the first sample needs logits).
Image rows are decoded as text rows are: causal attention, one position per row, and an image may
be spread over several steps (the room is shared); a projector whose model needs M-RoPE positions
(``mtmd_decode_use_mrope``) or non-causal attention over a whole image (``mtmd_decode_use_non_causal``,
Gemma 3) is therefore refused by the runner (runtime/child/vision.py), never decoded here.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from hydra_node.inference import MAX_TOP_LOGPROBS_REQUEST as MAX_TOP_LOGPROBS
from hydra_node.inference.events import MAX_DELTA_LOGPROBS as MAX_DELTA_TOKENS
from hydra_node.runtime.child.process import TokenClock
from hydra_node.runtime.child.engine.grammar_budget import DEFAULT_LIMITS, GrammarLimits
from hydra_node.runtime.child.engine.logprobs import LogprobReporter, TokenPieces, row_logits
from hydra_node.runtime.child.engine.media import MediaRows, is_media
from hydra_node.runtime.child.engine.sampler import Sampler, SamplerParams, SamplingError
from hydra_node.runtime.child.engine.slots import DecodeToken, Finish, PrefillChunk, Rejected, SlotConfig, StepPlan
from hydra_node.runtime.child.engine.spec_slots import SpeculativeSlots
from hydra_node.runtime.child.engine.reasoning_track import ReasoningTrack, budget_of, sampler_for, start_of
from hydra_node.runtime.child.engine.prompt_tiers import PromptTiers
from hydra_node.runtime.child.engine.speculation import SMALL_STEP_TOKENS, RoundPlan, speculation_eligible
from hydra_node.runtime.speculative.errors import DraftProtocolError
from hydra_node.runtime.child.stats import EngineStatistics, StepCounters
from hydra_node.runtime.child.textstream import TextAssembler, TextSkip

__all__ = ["BatchEngine", "EngineStatistics"]


@dataclass
class _Live:
    """A sequence's engine-side state: sampler, text assembly, timing, usage, logprobs."""

    rid: int
    prompt_len: int
    sampler: Sampler
    asm: TextAssembler
    clock: TokenClock
    reporter: LogprobReporter | None = None  # the request asked for logprobs
    pending: list | None = None  # logprob entries not sent yet (their text is held back)
    last: int = -1  # the latest sampled token, fed at the next step
    n: int = 0  # completion tokens (end-of-generation not counted)
    cached: int = 0  # prompt tokens reused from the slot's KV cells
    toks: list[int] = field(default_factory=list)  # tokens fed to ``asm`` since the last delta (its "tokens")
    skip: TextSkip = field(default_factory=TextSkip)  # a resumed request: the text its client already has
    think: ReasoningTrack | None = None  # a reasoning chat: thoughts split from the answer (reasoning_track.py)


class BatchEngine:
    def __init__(
        self,
        llm,
        *,
        n_slots: int,
        prompt_cache: bool,
        send: Callable[[dict], None],
        max_waiting: int = 16,
        token_delay_s: float = 0.0,
        clock: Callable[[], float] = time.perf_counter,
        share_prefixes: bool = True,
        min_shared_tokens: int = 64,
        max_cached: int | None = None,
        speculation=None,
        grammar_limits: GrammarLimits = DEFAULT_LIMITS,
    ):
        """``clock`` times each step for the statistics' rates (any monotonic clock); the prefix
        options are the slot scheduler's ([defaults.model_fit.prefix_cache], see slots.py);
        ``speculation``: an :class:`~hydra_node.runtime.child.engine.speculation.EngineSpeculation` or None;
        ``grammar_limits``: how long a request's grammar may work per token and per request
        (:mod:`~hydra_node.runtime.child.engine.grammar_budget`; past them: that request's 422 ``grammar_too_slow``)."""
        import llama_cpp
        from llama_cpp import _internals

        self._ll = llama_cpp
        self.llm = llm
        self.send = send
        self.token_delay_s = token_delay_s
        params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
        params.n_seq_max = n_slots
        params.kv_unified = True  # one shared buffer; the total budget is the scheduler's (see above)
        params.n_batch = max(int(params.n_batch), n_slots)  # a row per decoding sequence, at least
        llm._ctx.close()  # free the one-sequence context before allocating ours
        llm._ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=llm.verbose)
        self.ctx = llm._ctx.ctx
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))
        self.n_batch = int(llama_cpp.llama_n_batch(self.ctx))
        self.ctx_per_slot = self.n_ctx  # the most one request may use: any sequence may fill the unified cache
        self.vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self._pieces = TokenPieces(self.vocab)  # token text for logprobs, shared by the sequences
        self.sched = SpeculativeSlots(
            SlotConfig(
                n_slots=n_slots,
                n_batch=self.n_batch,
                n_ctx=self.n_ctx,
                max_waiting=max_waiting,
                prompt_cache=prompt_cache,
                share_prefixes=share_prefixes,
                min_shared_tokens=min_shared_tokens,
                max_cached=max_cached,
            )
        )
        self.n_slots = n_slots
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self._live: dict[int, _Live] = {}
        self.clock = clock
        self.counters = StepCounters()
        self._prefix_base = (0, 0, 0, 0)  # the scheduler's prefix counts at the end of the warm-up
        self.spec = speculation
        self.grammar_limits = grammar_limits
        self._threads = (int(llama_cpp.llama_n_threads(self.ctx)), int(llama_cpp.llama_n_threads_batch(self.ctx)))
        self.tiers: PromptTiers | None = None  # the prompt cache's RAM/disk tiers (attach_tiers)
        self._media: MediaRows | None = None  # the projector's embedding rows (attach_media)
        self._embd = None  # the llama_batch of image embeddings (attach_media)

    # ---- requests --------------------------------------------------------------------
    def submit(self, rid: int, req: dict, tokens: list[int], clock: TokenClock) -> None:
        """Queue a generation; it joins the batch at the next step.  Refusals become error frames.

        A resumed generation (``resume_tokens``: what an earlier runner generated; docs/scheduler.md
        "Continuing a stream") is prefilled as ``tokens`` + ``resume_tokens``; its sampler (grammar,
        penalties) and text assembler are advanced over them, the first ``resume_skip`` characters of
        its text are not sent again, and ``max_tokens`` is the budget left.  Its usage counts the
        original prompt and only the tokens generated here."""
        media = any(is_media(t) for t in tokens)  # image positions (placeholder ids, engine/media.py)
        if media and self._media is None:
            self.send(
                {
                    "op": "error",
                    "id": rid,
                    "code": "unsupported_parameter",
                    "status": 400,
                    "message": "the prompt holds images, but this runner loaded no vision projector "
                    "(mmproj) for its model: send the images to a host whose model has one",
                }
            )
            return
        try:
            resume, skip = self._resume(req, len(tokens))
        except SamplingError as exc:
            self.send(exc.frame(rid))
            return
        full = tokens + resume if resume else tokens
        budget = self.n_ctx - len(full)
        max_tokens = min(req.get("max_tokens") or budget, budget) if budget > 0 else 1
        try:
            reporter = self._reporter(req)
            start, thinking_budget = start_of(req), budget_of(req)
            sampler = sampler_for(  # a reasoning chat's grammar waits for the answer (reasoning_track.py)
                lambda params: Sampler(
                    params,
                    self.vocab,
                    window=max_tokens + len(resume),
                    grammar_limits=self.grammar_limits,
                    # the repeat penalty's window starts in the prompt (llama-server's), text tokens only
                    history=[t for t in tokens if not is_media(t)] if media else tokens,
                ),
                SamplerParams.from_request(req),
                start,
            )
            think = None if start is None else ReasoningTrack(start, thinking_budget, self._special_ids, sampler)
        except SamplingError as exc:  # an invalid grammar, a token outside the vocabulary...
            self.send(exc.frame(rid))
            return
        except Exception as exc:  # our bug or llama.cpp's: this request fails, the engine goes on
            self.send(
                {
                    "op": "error",
                    "id": rid,
                    "code": "runner_error",
                    "status": 500,
                    "message": f"cannot set up sampling: {type(exc).__name__}: {exc}",
                }
            )
            return
        live = _Live(
            rid,
            len(tokens),
            sampler,
            TextAssembler(tuple(req.get("stop") or ())),
            clock,
            reporter,
            [] if reporter is not None else None,
            skip=TextSkip(skip),
            think=think,
        )
        text, thought, ended = "", "", False
        for tok in resume:  # the text they make, as the earlier runner's assembler saw it
            if self._ll.llama_vocab_is_eog(self.vocab, tok):
                ended = True
                break
            r, a = self._split(live, live.asm.feed(self._piece(live, tok)), replay=tok)
            thought, text = thought + r, text + a
            if live.asm.stopped:
                ended = True
                break
        if ended:  # the resumed text already ended the generation (a stop sequence, end of generation)
            sampler.close()
            self._finish_at_once(live, text, thought)
            return
        try:
            sampler.advance(resume if think is None else think.resumed(resume))
            self.sched.submit(rid, full, max_tokens)
        except SamplingError as exc:  # the grammar does not allow the resumed tokens
            sampler.close()
            self.send(exc.frame(rid))
            return
        except Rejected as exc:
            sampler.close()
            self.send({"op": "error", "id": rid, "code": exc.code, "status": exc.status, "message": str(exc)})
            return
        self._live[rid] = live
        if text or thought:  # more than the client was said to have (resume_skip short of it): send the rest
            self.send({"op": "delta", "id": rid, "text": text, **({"reasoning": thought} if thought else {})})
        if self.spec is not None:  # a resumed request is not speculated (simple, safe: docs/scheduler.md)
            p = sampler.params
            plain = not (p.grammar or p.logit_bias or p.penalised)
            forcing = think is not None and think.budget is not None  # host-written tokens: never drafted
            eligible = speculation_eligible(req, p.greedy, plain, media)
            self.spec.admit(rid, eligible and not resume and not forcing)

    def _resume(self, req: dict, n_prompt: int) -> tuple[list[int], int]:
        """A request's ``resume_tokens`` (checked against the vocabulary and, with the prompt's
        ``n_prompt`` tokens, the context) and ``resume_skip``; :class:`SamplingError` (400) naming them."""
        resume, skip = req.get("resume_tokens") or [], req.get("resume_skip") or 0
        if not isinstance(resume, list) or type(skip) is not int or skip < 0:
            raise SamplingError("'resume_tokens' must be a list of token ids and 'resume_skip' a character count")
        for i, t in enumerate(resume):
            if type(t) is not int or not 0 <= t < self.n_vocab:
                raise SamplingError(
                    f"resume_tokens[{i}] is {t!r:.20}, outside this model's vocabulary (0 to {self.n_vocab - 1})"
                )
        if resume and n_prompt + len(resume) >= self.n_ctx:
            raise SamplingError(
                f"the prompt ({n_prompt} tokens) and resume_tokens ({len(resume)}) fill this model's "
                f"context of {self.n_ctx} tokens: nothing is left to generate",
                code="context_length_exceeded",
            )
        return list(resume), skip

    def _finish_at_once(self, live: _Live, text: str, thought: str = "") -> None:
        """A resumed request whose resumed text already ended it: its last text, then its done frame."""
        r, a = self._tail(live)
        text, thought = text + a, thought + r
        if text or thought:
            self.send({"op": "delta", "id": live.rid, "text": text, **({"reasoning": thought} if thought else {})})
        self.send(self._done_frame(live, "stop"))

    # ---- reasoning (reasoning_track.py) ----------------------------------------------------
    def _piece(self, live: _Live, tok: int) -> bytes:
        """A token's bytes as the output shows it (gpt-oss: its channel markers too)."""
        return self.llm.detokenize([tok], special=live.think is not None and live.think.special)

    def _special_ids(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def _split(self, live: _Live, text: str, *, forced: bool = False, replay: int | None = None) -> tuple[str, str]:
        """Text the assembler released as ``(reasoning, answer)``, less what a resumed client has."""
        if live.think is None:
            return "", live.skip(text)
        r, a = live.think.feed(text, forced) if replay is None else live.think.replayed(replay, text)
        return live.skip(r), live.skip(a)

    def _tail(self, live: _Live) -> tuple[str, str]:
        """The end of the output: what the assembler and the splitter held back."""
        text = live.asm.flush()
        if live.think is None:
            return "", live.skip(text)
        r, a = live.think.flush(text)
        return live.skip(r), live.skip(a)

    def _reporter(self, req: dict) -> LogprobReporter | None:
        want, top = req.get("logprobs", False), req.get("top_logprobs", 0)
        if type(want) is not bool or type(top) is not int or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise SamplingError(
                f"'logprobs' must be a boolean and 'top_logprobs' an integer from 0 to {MAX_TOP_LOGPROBS}"
            )
        if top and not want:
            raise SamplingError("'top_logprobs' needs 'logprobs': true")
        return LogprobReporter(top, self._pieces) if want else None

    def cancel(self, rid: int) -> None:
        self.sched.cancel(rid)  # an unknown id (already finished) is ignored

    @property
    def idle(self) -> bool:
        return self.sched.idle

    def statistics(self) -> EngineStatistics:
        s, c = self.sched.statistics(), self.counters
        prefill_tps, decode_tps = c.rates()
        hits, misses, reused, shared = (
            now - base
            for now, base in zip(
                (s.prefix_hits, s.prefix_misses, s.prefix_reused_tokens, s.prefix_shared), self._prefix_base
            )
        )
        return EngineStatistics(
            n_slots=self.n_slots,
            ctx_per_slot=self.ctx_per_slot,
            steps=c.steps,
            batch_last=c.batch_last,
            batch_mean=round(c.batch_mean, 3),
            active=s.active,
            waiting=s.waiting,
            free_slots=self.n_slots - s.active,
            kv_used=s.kv_used,
            kv_budget=s.kv_total,
            prefill_tokens_per_s=round(prefill_tps, 1),
            decode_tokens_per_s=round(decode_tps, 1),
            prefix_hits=hits,
            prefix_misses=misses,
            prefix_reused_tokens=reused,
            prefix_shared=shared,
            **(self.tiers.statistics() if self.tiers is not None else {}),
        )

    # ---- one step ----------------------------------------------------------------------
    def step(self) -> None:
        plan = self.sched.plan()
        if self.tiers is not None:  # prefixes the plan gives up: saved while their cells are intact
            for slot, held, kept in self.sched.take_dropped():
                self.tiers.save(slot, held, kept)
        for rid, why in plan.finished:  # cancelled, or cut with "length" because the KV cache is full
            self._end(rid, None if why is Finish.CANCELLED else why.value)
        for slot in plan.evicted:  # cached prefixes dropped to make room
            self._ll.llama_memory_seq_rm(self.mem, slot, 0, -1)
        unrestored: set[int] = set()  # slots whose planned restore failed (and slots copying from them)
        for a in (*plan.admitted, *plan.copies):
            if a.restore is not None and self.tiers is not None:  # a saved prefix (docs/prompt-cache.md)
                if not self.tiers.restore(a.slot, a.restore):
                    unrestored.add(a.slot)
            elif a.copy_from >= 0:  # a prefix another slot holds: share its cells (unified cache: no copy)
                self._ll.llama_memory_seq_rm(self.mem, a.slot, 0, -1)
                if a.copy_from in unrestored:
                    unrestored.add(a.slot)
                else:
                    self._ll.llama_memory_seq_cp(self.mem, a.copy_from, a.slot, 0, a.reused)
            else:
                self._ll.llama_memory_seq_rm(self.mem, a.slot, a.reused, -1)
            self._live[a.rid].cached = a.reused
        if unrestored:  # those prompts are prefilled from the start, from the next step
            for a in (*plan.admitted, *plan.copies):
                if a.slot in unrestored:
                    self.sched.unrestore(a.rid)
                    self._live[a.rid].cached = 0
            plan = replace(plan, prefill=tuple(c for c in plan.prefill if c.slot not in unrestored))
        if plan.empty:
            return
        rp = (
            None
            if self.spec is None
            else self.spec.plan(
                [d.rid for d in plan.decode],
                self.sched.draft_room,
                self.sched.committed,
                self.n_batch - plan.n_tokens,
                len(plan.decode) == 1 and not plan.prefill,
            )
        )
        rows = self._fill(plan, rp)
        n_media = self._fill_media(plan) if self._media is not None else 0
        small = (
            rp is not None
            and rp.k > 0
            and plan.n_tokens + rp.k <= SMALL_STEP_TOKENS
            and self._threads[0] != self._threads[1]
        )  # a verify pass: decode-like, decode threads
        if small:
            self._ll.llama_set_n_threads(self.ctx, self._threads[0], self._threads[0])
        t0 = self.clock()
        rc, what = 0, f"{plan.n_tokens} tokens"
        if n_media:  # image rows first: the token batch's decode leaves the logits the step samples
            rc = self._ll.llama_decode(self.ctx, self._embd)
            what = f"{n_media} image embeddings"
        if rc == 0 and self._batch.n_tokens:
            rc = self._ll.llama_decode(self.ctx, self._batch)
            what = f"{self._batch.n_tokens} tokens"
        if small:
            self._ll.llama_set_n_threads(self.ctx, *self._threads)
        if rc != 0:
            self._fail_step(plan, f"llama_decode failed (rc={rc}) on a batch of {what}")
            return
        sampled: dict[int, int] = {}
        spec_out: tuple[int, int | None] | None = None  # (accepted, next token) of the draft holder
        for rid, row in rows.items():
            live = self._live[rid]
            forced = None  # a token the host writes (a spent thinking budget: reasoning_track.py)
            if rp is not None and rid == rp.rid and rp.k > 0:
                toks = self._verified(plan, rp, row)
                spec_out = (len(toks) - 1, None)
            else:
                try:
                    forced = live.think.forced() if live.think is not None else None
                    toks = [live.sampler.sample(self.ctx, row) if forced is None else forced]
                except SamplingError as exc:  # its grammar left no token: this request fails, the others go on
                    self.sched.finish(rid)
                    self._live.pop(rid).sampler.close()
                    self._release_spec(rid)
                    self.send(exc.frame(rid))
                    continue
            if self._emit(live, row, toks, forced=forced is not None):
                live.last = toks[-1]
                sampled[rid] = toks[-1]
                if rp is not None and rid == rp.rid:
                    spec_out = (len(toks) - 1, toks[-1])
        for rid, _why in self.sched.commit(plan, sampled):
            self._end(rid, Finish.LENGTH.value)
        if sampled and self.token_delay_s > 0:  # test/bench knob: a slower host ([runner] config)
            time.sleep(self.token_delay_s)
        seconds = max(0.0, self.clock() - t0)
        if rp is not None:
            accepted, nxt = spec_out if spec_out is not None else (0, None)
            self.spec.finished_round(rp, accepted, nxt, seconds)
        self.counters.record(
            seqs=len(plan.decode) + len(plan.prefill),
            decode_tokens=len(plan.decode) + (rp.k if rp is not None else 0),
            prefill_tokens=plan.n_tokens - len(plan.decode),
            seconds=seconds,
        )

    def _verified(self, plan: StepPlan, rp: RoundPlan, row: int) -> list[int]:
        """The holder's tokens this step: accepted drafts, then the target's own; the rejected
        drafts' cells are dropped (``llama_memory_seq_rm`` for its sequence only)."""
        d = next(x for x in plan.decode if x.rid == rp.rid)
        try:
            accepted, nxt = self.spec.verify(self.ctx, row, rp, self.n_vocab)
        except DraftProtocolError as exc:  # the draft's fault: row 0 is a plain step's logits
            self.spec.retire_current(exc)
            accepted, nxt = 0, self._live[rp.rid].sampler.sample(self.ctx, row)
        self._ll.llama_memory_seq_rm(self.mem, d.slot, d.pos + 1 + accepted, -1)
        self.sched.accept(rp.rid, rp.drafts[:accepted])
        return [*rp.drafts[:accepted], nxt]

    def _emit(self, live: _Live, row: int, toks: list[int], forced: bool = False) -> bool:
        """Stream ``toks`` (one, or a verified run; ``forced``: the one token the host wrote);
        False when the sequence ended among them."""
        for i, tok in enumerate(toks):
            live.clock.tick()
            ended = bool(self._ll.llama_vocab_is_eog(self.vocab, tok))
            if not ended:
                live.n += 1
                if live.reporter is not None:  # before the next decode overwrites this row's logits
                    assert live.pending is not None  # a list whenever there is a reporter
                    live.pending.append(live.reporter.entry(row_logits(self.ctx, row, self.n_vocab), tok))
                live.toks.append(tok)
                thought, text = self._split(live, live.asm.feed(self._piece(live, tok)), forced=forced)
                if text or thought or len(live.toks) >= MAX_DELTA_TOKENS:
                    self._delta(live, text, thought)
                ended = live.asm.stopped
            if ended:
                self._finish_in_step(live.rid, trim=len(toks) > 1)
                return False
        return True

    def _finish_in_step(self, rid: int, trim: bool) -> None:
        slot = self.sched.slot_of(rid) if trim else -1
        self.sched.finish(rid)
        if trim:  # a verified run ended early: the slot keeps its scheduler-known prefix only
            self._ll.llama_memory_seq_rm(self.mem, slot, len(self.sched.resident(slot)), -1)
        self._end(rid, "stop")

    def _fill(self, plan: StepPlan, rp: RoundPlan | None = None) -> dict[int, int]:
        """Write the plan into the llama_batch; returns rid -> row whose logits we sample."""
        b = self._batch
        rows: dict[int, int] = {}
        i = 0

        def add(tok: int, pos: int, seq: int, logits: bool) -> None:
            nonlocal i
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
            b.seq_id[i][0] = seq
            i += 1

        for d in plan.decode:
            rows[d.rid] = i
            add(self._live[d.rid].last, d.pos, d.slot, True)
            if rp is not None and rp.rid == d.rid:  # the draft tokens, every row with logits
                for j, tok in enumerate(rp.drafts):
                    add(tok, d.pos + 1 + j, d.slot, True)
        for c in plan.prefill:
            prompt = self.sched.prompt_of(c.rid)
            if is_media(prompt[c.start]):  # image rows: the embeddings batch (_fill_media)
                continue
            for j in range(c.length):
                end = c.last and j == c.length - 1
                if end:
                    rows[c.rid] = i
                add(prompt[c.start + j], c.start + j, c.slot, end)
        b.n_tokens = i
        return rows

    def _fill_media(self, plan: StepPlan) -> int:
        """Write the plan's image chunks (each all image positions: the scheduler cuts chunks at the
        boundaries) into the embeddings batch, rows from ``MediaRows``; returns its rows.  A sequence
        whose rows cannot be had fails alone (500 ``runner_error``) before anything is decoded."""
        assert self._media is not None and self._embd is not None
        b, width = self._embd, self._media.n_embd * ctypes.sizeof(ctypes.c_float)
        base = ctypes.cast(b.embd, ctypes.c_void_p).value
        assert base is not None
        i = 0
        for c in plan.prefill:
            prompt = self.sched.prompt_of(c.rid)
            if not is_media(prompt[c.start]):
                continue
            assert not c.last, "a prompt ends with a text token (SlotScheduler.submit)"
            try:
                data = bytes(self._media.rows(prompt[c.start : c.start + c.length]))
                if len(data) != c.length * width:
                    raise ValueError(f"{len(data)} bytes of embeddings for {c.length} rows of {width} bytes")
            except Exception as exc:  # an unregistered placeholder, a failed encode: this request only
                self.sched.finish(c.rid, decoded=False)  # its slot keeps the cells decoded so far
                self._live.pop(c.rid).sampler.close()
                self._release_spec(c.rid)
                self.send(
                    {
                        "op": "error",
                        "id": c.rid,
                        "code": "runner_error",
                        "status": 500,
                        "message": f"cannot embed the image positions {c.start}..{c.start + c.length - 1} "
                        f"of the prompt: {type(exc).__name__}: {exc}",
                    }
                )
                continue
            ctypes.memmove(base + i * width, data, len(data))
            for j in range(c.length):
                b.pos[i + j], b.n_seq_id[i + j], b.logits[i + j] = c.start + j, 1, False
                b.seq_id[i + j][0] = c.slot
            i += c.length
        b.n_tokens = i
        return i

    def _fail_step(self, plan: StepPlan, message: str) -> None:
        """A failed decode: every sequence in it gets an error; their cells are dropped."""
        seqs: tuple[DecodeToken | PrefillChunk, ...] = (*plan.decode, *plan.prefill)
        for rid in {d.rid for d in plan.decode} | {c.rid for c in plan.prefill}:
            slot = next(x.slot for x in seqs if x.rid == rid)
            self.sched.finish(rid, decoded=False)
            self._ll.llama_memory_seq_rm(self.mem, slot, 0, -1)
            live = self._live.pop(rid)
            live.sampler.close()
            self._release_spec(rid)
            self.send({"op": "error", "id": rid, "code": "runner_error", "status": 500, "message": message})
        for slot in self.sched.forget_resident():  # untrusted now: free their cells for the budget
            self._ll.llama_memory_seq_rm(self.mem, slot, 0, -1)

    def _end(self, rid: int, finish: str | None) -> None:
        """Finish ``rid``: ``None`` = cancelled (an error frame), else a done frame with usage."""
        live = self._live.pop(rid)
        live.sampler.close()
        self._release_spec(rid)
        if finish is None:
            self.send({"op": "error", "id": rid, "code": "cancelled", "status": 499, "message": "cancelled"})
            return
        thought, tail = self._tail(live)
        if tail or thought or live.pending or live.toks:
            self._delta(live, tail, thought)
        self.send(self._done_frame(live, finish))

    def _done_frame(self, live: _Live, finish: str) -> dict:
        done = {
            "op": "done",
            "id": live.rid,
            "finish_reason": finish,
            "prompt_tokens": live.prompt_len,  # a resumed request: the original prompt only
            "completion_tokens": live.n,  # the tokens generated here (a resumed request's too)
            "cached_tokens": min(live.cached, live.prompt_len),
            "ttft_ms": live.clock.ttft_ms(),
            "itl_ms": live.clock.itl_ms(live.n),
        }
        if live.think is not None:  # of completion_tokens, those the model spent thinking
            done["reasoning_tokens"] = live.think.tokens
        if self.spec is not None:  # the runner's latest speculation figures (/api/status)
            done["speculative"] = self.spec.status()
        return done

    def _release_spec(self, rid: int) -> None:
        if self.spec is not None:
            self.spec.release(rid)

    def _delta(self, live: _Live, text: str, reasoning: str = "") -> None:
        """A delta frame: ``text`` (the answer), ``reasoning`` (thoughts, when there are some), the
        logprob entries and the ids of the tokens fed since the last one."""
        frame: dict = {"op": "delta", "id": live.rid, "text": text}
        if reasoning:
            frame["reasoning"] = reasoning
        if live.pending:
            frame["logprobs"], live.pending = live.pending, []
        if live.toks:
            frame["tokens"], live.toks = live.toks, []
        self.send(frame)

    def fail_all(self, message: str) -> None:
        """Something went wrong mid-step: every sequence gets an error, the KV cache is cleared."""
        for rid in self.sched.drop_all():
            live = self._live.pop(rid, None)
            if live is not None:
                live.sampler.close()
            self._release_spec(rid)
            self.send({"op": "error", "id": rid, "code": "runner_error", "status": 500, "message": message})
        self._ll.llama_memory_clear(self.mem, True)

    # ---- life ----------------------------------------------------------------------------
    def attach_media(self, rows: MediaRows) -> None:
        """Serve prompts with images: their placeholder positions are decoded from ``rows``'
        embeddings (the runner's projector, runtime/child/vision.py), which must be as wide as the
        model's input embeddings (``llama_model_n_embd_inp``; ValueError otherwise)."""
        want = int(self._ll.llama_model_n_embd_inp(self.llm._model.model))
        if rows.n_embd != want:
            raise ValueError(
                f"the projector's embeddings are {rows.n_embd} wide; this model's input embeddings are {want}"
            )
        if self._embd is None:
            self._embd = self._ll.llama_batch_init(self.n_batch, want, 1)
        self._media = rows

    def attach_tiers(self, tiers: PromptTiers) -> None:
        """Keep the prefixes slots lose in ``tiers`` and restore them on a hit (docs/prompt-cache.md)."""
        self.tiers = tiers
        self.sched.tiers = tiers

    def persist(self) -> None:
        """The runner stops: what the free slots still cache goes to the tiers (the disk tier keeps it)."""
        if self.tiers is not None:
            self.tiers.persist(self.sched.held())

    def warmup(self, tokens: list[int], steps: int = 2) -> None:
        """Allocate compute buffers and fault the weights in before reporting ready."""
        sink: list[dict] = []
        send, self.send = self.send, sink.append
        spec, self.spec = self.spec, None  # cold steps must not teach the speculation controller
        try:
            self.submit(0, {"temperature": 0.0, "max_tokens": steps}, tokens, TokenClock())
            while not self.idle:
                self.step()
        finally:
            self.send, self.spec = send, spec
        self.clear_cache()
        self.counters = StepCounters()  # the figures describe served requests, not the warm-up
        s = self.sched.statistics()
        self._prefix_base = (s.prefix_hits, s.prefix_misses, s.prefix_reused_tokens, s.prefix_shared)

    def clear_cache(self) -> None:
        """Drop every cached prefix (only while idle): the next requests start from an empty KV cache.

        Other sequences' cells in the unified cache are masked out, yet their presence changes a
        sequence's logits: on the bundled model the same greedy request gave identical logits for its
        first tokens, then a logprob 0.1 apart, depending only on whether another (finished) sequence's
        cells were still cached.  The cause (likely which kernel llama.cpp picks for the cache's
        occupancy) is not established; so greedy output is reproducible from an empty cache, and
        may part at a near tie otherwise."""
        assert self.idle, "clear_cache while sequences are active"
        self._ll.llama_memory_clear(self.mem, True)
        self.sched.forget_resident()

    def close(self) -> None:
        for live in self._live.values():
            live.sampler.close()
        self._live.clear()
        if self._batch is not None:
            self._ll.llama_batch_free(self._batch)
            self._batch = None
        if self._embd is not None:
            self._ll.llama_batch_free(self._embd)
            self._embd = None
