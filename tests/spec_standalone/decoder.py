"""Speculative decoding rounds until max_tokens, end-of-generation or a stop sequence.

Each round: the controller picks k; the draft proposes k tokens; the target verifies
them in one batched pass and commits ``accepted`` of them plus one token of its own;
the draft is told the outcome.  k == 0 is one plain target step.  Any failure on the
draft side (an exception, an invalid proposal) retires the draft for the rest of the
request and the target finishes alone: the output does not change, only the speed.

One decoder serves one request at a time (the sessions share the engines' caches).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from hydra_node.runtime.child.speculative.controller import SpeculationController, SpeculationStats
from hydra_node.runtime.child.speculative.draft import Drafter, Proposal
from hydra_node.runtime.child.speculative.llama_engine import LlamaEngine
from hydra_node.runtime.speculative.errors import DraftProtocolError
from hydra_node.runtime.child.speculative.sampling import SamplingParams
from spec_standalone.target import TargetSession
from hydra_node.runtime.child.textstream import TextAssembler

log = logging.getLogger(__name__)

#: Tokens a draft evaluates before drafting in a steady round: the target's token, plus the
#: last draft token when all were accepted.  More means it caught up on plain steps.
CATCHUP_NORMAL = 2


@dataclass(frozen=True)
class Emitted:
    """One generated token and the text it released (may be empty: held back or partial UTF-8)."""

    token: int
    text: str


@dataclass(frozen=True)
class Completion:
    """The last event of a generation."""

    finish_reason: str  # "stop" (end of generation or stop sequence) | "length"
    prompt_tokens: int
    completion_tokens: int
    text_tail: str  # text released at the end (held back until then)
    rounds: int
    drafted: int
    accepted: int
    rejections: int  # rounds that ended at a rejected draft token
    target_steps: int
    draft_failure: str | None  # why the draft was retired, if it was


SpeculativeEvent = Emitted | Completion


class SpeculativeDecoder:
    def __init__(
        self,
        target: LlamaEngine,
        draft: Drafter | None,
        controller: SpeculationController | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.target_engine = target
        self.draft = draft
        self.controller = controller or SpeculationController()
        self._clock = clock

    def statistics(self) -> SpeculationStats:
        return self.controller.statistics()

    def generate(
        self,
        prompt_tokens: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        stop: Sequence[str] = (),
        seed: int | None = None,
    ) -> Iterator[SpeculativeEvent]:
        """Yield :class:`Emitted` per token, then one :class:`Completion`."""
        if max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        run = _Run(self, prompt_tokens, sampling, stop, seed)
        yield from run.events(max_tokens)


class _Run:
    """The state of one generation."""

    def __init__(
        self,
        dec: SpeculativeDecoder,
        prompt: Sequence[int],
        sampling: SamplingParams,
        stop: Sequence[str],
        seed: int | None,
    ) -> None:
        self.dec = dec
        self.engine = dec.target_engine
        self.sampling = sampling
        self.target = TargetSession(self.engine)
        self.target.start(prompt, seed)
        self.n_prompt = len(prompt)
        self.text = TextAssembler(stop)
        self.draft: Drafter | None = dec.draft
        self.failure: str | None = None
        self.rounds = self.drafted = self.accepted = self.rejections = self.steps = 0
        if self.draft is not None:
            self._guard(self.draft.start, prompt, sampling, seed)

    def _guard(self, fn, *args):
        """Call the draft; on any failure retire it (the target carries on alone)."""
        try:
            return fn(*args)
        except Exception as exc:  # a draft may fail in any way; the request must not
            self._retire(exc)
            return None

    def _retire(self, exc: Exception) -> None:
        self.failure = f"{type(exc).__name__}: {exc}"
        log.warning("speculative draft retired, target continues alone: %s", self.failure)
        self.draft = None

    def events(self, max_tokens: int) -> Iterator[SpeculativeEvent]:
        emitted = 0
        reason = "length"
        while emitted < max_tokens:
            if self.target.room < 0:
                break
            new = self._round(max_tokens - emitted)
            done = False
            for tok in new:
                if self.engine.is_eog(tok):
                    reason, done = "stop", True
                    break
                emitted += 1
                yield Emitted(tok, self.text.feed(self.engine.detokenize([tok])))
                if self.text.stopped:
                    reason, done = "stop", True
                    break
                if emitted >= max_tokens:
                    break
            if done:
                break
        yield Completion(
            reason,
            self.n_prompt,
            emitted,
            self.text.flush(),
            self.rounds,
            self.drafted,
            self.accepted,
            self.rejections,
            self.steps,
            self.failure,
        )

    def _round(self, remaining: int) -> list[int]:
        ctl = self.dec.controller
        clock = self.dec._clock
        k = min(ctl.choose_k(), remaining - 1, self.target.room) if self.draft is not None else 0
        if k >= 1:
            t0 = clock()
            prop = self._guard(self._propose, k)
            t1 = clock()
            if prop is not None:
                try:
                    verdict = self.target.verify(prop.tokens, prop.dists, self.sampling)
                except DraftProtocolError as exc:  # the draft's fault; the target is untouched
                    self._retire(exc)
                else:
                    n = len(prop.tokens)  # k <= room, so the target verified all of them
                    draft_s = min(prop.seconds, t1 - t0)
                    ctl.record_round(
                        n,
                        verdict.accepted,
                        draft_s,
                        clock() - t1,
                        (t1 - t0) - draft_s,
                        draft_cost_representative=prop.catchup_tokens <= CATCHUP_NORMAL,
                    )
                    self.rounds += 1
                    self.drafted += n
                    self.accepted += verdict.accepted
                    self.rejections += verdict.accepted < n
                    if self.draft is not None:
                        self._guard(self.draft.commit, verdict.accepted, verdict.next_token)
                    return list(prop.tokens[: verdict.accepted]) + [verdict.next_token]
        t0 = clock()
        tok = self.target.step(self.sampling)
        ctl.record_target_step(clock() - t0)
        self.steps += 1
        if self.draft is not None:
            self._guard(self.draft.extend, [tok])
        return [tok]

    def _propose(self, k: int) -> Proposal:
        """Ask the draft for k tokens and check the shape of what came back."""
        prop = self.draft.propose(k)
        if not isinstance(prop, Proposal) or not 1 <= len(prop.tokens) <= k:
            raise DraftProtocolError(f"asked for {k} draft tokens, got {prop!r:.80}")
        if not (isinstance(prop.seconds, (int, float)) and math.isfinite(prop.seconds) and prop.seconds >= 0):
            raise DraftProtocolError(f"draft reported an invalid compute time {prop.seconds!r}")
        return prop
