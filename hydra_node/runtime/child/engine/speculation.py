"""Speculative decoding inside the batch engine: draft tokens verified in the engine's own step.

One sequence at a time holds the draft (a *lease*: a draft model has one KV cache, a draft server
one drafting connection); every other sequence decodes as usual in the same batch.  A step of
the holder, when the controller chooses ``k >= 1``:

1. the draft proposes ``k`` tokens (:class:`~hydra_node.runtime.child.speculative.draft.Drafter`:
   a local :class:`DraftSession` with its own llama context, or a :class:`RemoteDrafter` through
   the mesh — same protocol);
2. the engine puts the holder's last token and the ``k`` drafts in the SAME ``llama_batch`` as
   the other sequences' decode tokens and prefill chunks, every verify row with logits;
3. :meth:`EngineSpeculation.verify` takes the target's argmax of each row, keeps the longest
   agreeing prefix (:func:`~hydra_node.runtime.child.speculative.acceptance.verify_greedy`) plus the
   target's own next token, and drops the rejected cells (``llama_memory_seq_rm`` from the first
   rejected position, for that sequence id only).

Every emitted token is the target's argmax given the committed prefix: greedy output is unchanged.
Only plain greedy requests speculate (temperature 0, no grammar, logit bias, penalties — presence,
frequency or llama-server's repeat penalty —, logprobs or images in the prompt; ``top_k`` and ``min_p`` never drop the
most likely token, so a greedy request with them still speculates, exactly): the engine's sampled path is llama.cpp's native chain, whose distribution the
rejection-sampling rule would have to reproduce exactly; such requests decode normally in the
batch (never refused).

The controller (:class:`~hydra_node.runtime.child.speculative.controller.SpeculationController`, pure,
one per runner, so per model) decides k from MEASURED figures: plain steps of the holder (k = 0)
time the engine's own decode rate, speculative rounds time draft + verify step per emitted token;
when the measured ratio falls below ``min_speedup`` the holder decodes plainly, and while off the
draft does no work at all (no prompt evaluation, no proposals) except a probe round now and
then.  Any draft failure retires the draft for that request (the target finishes alone, same
output).  Only steps where the holder decodes alone are timed and, unless ``mixed_batches``,
speculated: with other sequences in the step the draft's compute would stall them all.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from hydra_node.runtime.child.engine.logprobs import row_logits
from hydra_node.runtime.child.speculative.acceptance import check_draft_tokens, verify_greedy
from hydra_node.runtime.child.speculative.draft import Drafter, Proposal
from hydra_node.runtime.child.speculative.controller import SpeculationController
from hydra_node.runtime.speculative.errors import DraftProtocolError
from hydra_node.runtime.child.speculative.sampling import SamplingParams

if TYPE_CHECKING:
    from hydra_node.runtime.child.speculative.remote import RemoteDrafter

__all__ = ["EngineSpeculation", "RoundPlan", "speculation_eligible"]

log = logging.getLogger("hydra.runner.speculative")

#: Tokens a draft evaluates before drafting in a steady round (the target's token, plus the last
#: draft token when all were accepted); more means it caught up (prompt, plain steps).
CATCHUP_NORMAL = 2
#: A step of at most this many tokens (a verify pass beside a few decode tokens) runs on the decode
#: thread count, as in :mod:`hydra_node.runtime.child.speculative.llama_engine` (SMALL_BATCH_TOKENS).
SMALL_STEP_TOKENS = 16


def speculation_eligible(req: dict, greedy: bool, plain_chain: bool, media: bool = False) -> bool:
    """A request that may speculate: greedy, nothing in its chain but the argmax, no logprobs, and
    no image positions in its prompt (``media``: a draft, local or remote, evaluates the prompt's
    token ids and has no projector for the placeholders standing for an image, engine/media.py)."""
    return greedy and plain_chain and not media and not req.get("logprobs") and not req.get("top_logprobs")


@dataclass
class _Lease:
    rid: int
    started: bool = False
    retired: str | None = None  # why the draft was retired for this request
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    plain: int = 0


@dataclass(frozen=True)
class RoundPlan:
    """What the holder does this step: ``k`` = 0 a plain step (``timed``: record it), else verify."""

    rid: int
    k: int
    drafts: tuple[int, ...] = ()
    draft_s: float = 0.0
    rtt_s: float = 0.0
    catchup: int = 1
    timed: bool = True
    setup_s: float = 0.0  # the draft's start on the prompt (first round of a lease)


@dataclass
class EngineSpeculation:
    drafter: Drafter
    controller: SpeculationController
    kind: str  # "local" | "remote"
    remote: RemoteDrafter | None = None  # status, close per request
    clock: Callable[[], float] = time.perf_counter
    #: Speculate while other sequences share the batch.  Off by default: the draft's compute (local,
    #: on the same cores) stalls every sequence of the step for one sequence's gain, and such steps
    #: cannot be compared with the plain rate; on for exactness tests and where it pays.
    mixed_batches: bool = False
    requests: int = 0
    draft_failures: int = 0
    last_draft_failure: str | None = None
    _lease: _Lease | None = None
    _eligible: set = field(default_factory=set)
    _last: dict | None = None

    # ---- requests ----------------------------------------------------------------------
    def admit(self, rid: int, eligible: bool) -> None:
        self.requests += 1
        if eligible:
            self._eligible.add(rid)

    def holder(self) -> int | None:
        return None if self._lease is None else self._lease.rid

    def release(self, rid: int) -> None:
        """``rid`` ended (any way): the draft is free for the next greedy request."""
        self._eligible.discard(rid)
        lease = self._lease
        if lease is None or lease.rid != rid:
            return
        self._last = {
            "rounds": lease.rounds,
            "drafted": lease.drafted,
            "accepted": lease.accepted,
            "rejections": lease.rejections,
            "target_steps": lease.plain,
            "draft_failure": lease.retired,
        }
        self._lease = None
        if self.remote is not None and lease.started:
            self.remote.close()

    # ---- one step ------------------------------------------------------------------------
    def plan(
        self,
        decoding: list[int],
        room: Callable[[int], int],
        committed: Callable[[int], tuple],
        batch_room: int,
        alone: bool,
    ) -> RoundPlan | None:
        """Choose the holder (the lease, or the first eligible decoding sequence) and its round.
        ``alone``: the holder is the step's only sequence (nothing else decodes or prefills): only
        such steps are timed, so plain steps and rounds are compared like for like."""
        lease = self._lease
        if lease is None:
            rid = next((r for r in decoding if r in self._eligible), None)
            if rid is None:
                return None
            lease = self._lease = _Lease(rid)
        if lease.rid not in decoding:
            return None  # still prefilling (or not in this step)
        if lease.retired is not None:
            return RoundPlan(lease.rid, 0, timed=False)
        cap = min(room(lease.rid), batch_room)
        if cap < 1 or not (alone or self.mixed_batches):
            return RoundPlan(lease.rid, 0, timed=False)  # not a comparable step: do not ask the controller
        k = min(self.controller.choose_k(), cap)
        if k < 1:
            return RoundPlan(lease.rid, 0, timed=alone)
        t0 = self.clock()
        start_s = 0.0
        try:
            if not lease.started:  # the draft evaluates the prompt now: a cost of this round, not per token
                lease.started = True
                self.drafter.start(list(committed(lease.rid)), SamplingParams(temperature=0.0), None)
                start_s = self.clock() - t0
            t1 = self.clock()
            prop = self._checked(self.drafter.propose(k), k)
        except Exception as exc:  # a draft may fail in any way; the request must not
            self._retire(lease, exc)
            return RoundPlan(lease.rid, 0, timed=False)
        wall = self.clock() - t1
        draft_s = min(prop.seconds, wall)
        return RoundPlan(
            lease.rid,
            len(prop.tokens),
            tuple(prop.tokens),
            draft_s,
            wall - draft_s,
            prop.catchup_tokens,
            setup_s=start_s,
        )

    def _checked(self, prop: Proposal, k: int) -> Proposal:
        if not isinstance(prop, Proposal) or not 1 <= len(prop.tokens) <= k:
            raise DraftProtocolError(f"asked for {k} draft tokens, got {prop!r:.80}")
        if not (isinstance(prop.seconds, (int, float)) and math.isfinite(prop.seconds) and prop.seconds >= 0):
            raise DraftProtocolError(f"draft reported an invalid compute time {prop.seconds!r}")
        check_draft_tokens(prop.tokens, 1 << 30)  # ids are checked against the vocabulary in verify
        return prop

    def verify(self, ctx, row: int, rp: RoundPlan, n_vocab: int) -> tuple[int, int]:
        """(accepted, next token) from the target's rows ``row .. row + k`` of the last decode."""
        if any(not 0 <= t < n_vocab for t in rp.drafts):
            raise DraftProtocolError(f"draft token outside the vocabulary (0..{n_vocab - 1})")
        argmax = [int(np.argmax(row_logits(ctx, row + i, n_vocab))) for i in range(rp.k + 1)]
        v = verify_greedy(rp.drafts, argmax)
        return v.accepted, v.next_token

    def finished_round(self, rp: RoundPlan, accepted: int, next_token: int | None, step_s: float) -> None:
        """After the step: tell the controller and the draft what happened (``next_token`` None:
        the request ended in this step, so the draft is not told)."""
        lease = self._lease
        if lease is None or lease.rid != rp.rid:
            return
        if rp.k == 0:
            lease.plain += 1
            if rp.timed:
                self.controller.record_target_step(step_s)
            if lease.started and lease.retired is None and next_token is not None:
                self._guard(lease, self.drafter.extend, [next_token])
            return
        if lease.retired is not None:  # the draft failed in this very round: nothing to learn
            return
        lease.rounds += 1
        lease.drafted += rp.k
        lease.accepted += accepted
        lease.rejections += accepted < rp.k
        self.controller.record_round(
            rp.k,
            accepted,
            rp.draft_s,
            step_s,
            rp.rtt_s,
            draft_cost_representative=rp.catchup <= CATCHUP_NORMAL,
            setup_seconds=rp.setup_s,
        )
        if next_token is not None:
            self._guard(lease, self.drafter.commit, accepted, next_token)

    def retire_current(self, exc: Exception) -> None:
        if self._lease is not None:
            self._retire(self._lease, exc)

    def _guard(self, lease: _Lease, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._retire(lease, exc)

    def _retire(self, lease: _Lease, exc: Exception) -> None:
        lease.retired = f"{type(exc).__name__}: {exc}"[:300]
        self.draft_failures += 1
        self.last_draft_failure = lease.retired
        log.warning("speculative draft retired, target continues alone: %s", lease.retired)

    # ---- figures ----------------------------------------------------------------------------
    def status(self, rid: int | None = None) -> dict:
        st = self.controller.statistics()
        recent = self.controller.recent_speedup()
        out: dict[str, Any] = {
            "draft": self.kind,
            "disabled": None,
            "acceptance_rate": round(st.acceptance_rate, 4),
            "tokens_per_round": round(st.tokens_per_round, 3),
            "k": st.k,
            "predicted_speedup": round(st.predicted_speedup, 3),
            "measured_speedup": round(st.measured_speedup, 3),
            "recent_speedup": None if recent is None else round(recent, 3),
            "rounds": st.rounds,
            "draft_tokens": st.draft_tokens,
            "accepted_tokens": st.accepted_tokens,
            "target_only_tokens": st.target_only_tokens,
            "speculating": st.speculating,
            "requests": self.requests,
            "draft_failures": self.draft_failures,
            "last_draft_failure": self.last_draft_failure,
            "in_engine": True,
        }
        if self.remote is not None:
            out["remote"] = self.remote.status()
        if self._last is not None:
            out["last_request"] = self._last
        return out
