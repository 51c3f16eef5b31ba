"""The drafting side: proposes k tokens, then learns what the target kept.

Only token ids (and, when sampling, the sparse distributions the proposals were drawn
from) leave a draft, so the same interface can sit behind a network link later.
Invariant: the KV cache holds a prefix of ``tokens`` (committed text); ``propose``
first evaluates the part not yet cached, in one batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from hydra_node.runtime.child.speculative.llama_engine import LlamaEngine
from hydra_node.runtime.speculative.errors import ContextFull, SessionStateError
from hydra_node.runtime.child.speculative.sampling import SamplingParams, SparseDist, draft_distribution, sample_sparse


@dataclass(frozen=True)
class Proposal:
    """k draft tokens; ``dists`` only when sampling; ``seconds`` = the draft's own compute time
    (so a caller across a network can tell compute from round-trip); ``catchup_tokens`` = how
    many committed tokens it evaluated first (1 or 2 while speculating, more after plain steps,
    which makes ``seconds`` unrepresentative of the per-token draft cost)."""

    tokens: tuple[int, ...]
    dists: tuple[SparseDist, ...] | None
    seconds: float
    catchup_tokens: int = 1


class Drafter(Protocol):
    """What the decoder needs from a draft, local or remote."""

    def start(self, prompt_tokens: Sequence[int], sampling: SamplingParams, seed: int | None) -> None: ...

    def propose(self, k: int) -> Proposal: ...

    def commit(self, accepted: int, next_token: int) -> None: ...

    def extend(self, tokens: Sequence[int]) -> None: ...


class DraftSession:
    """An in-process draft over a :class:`LlamaEngine`."""

    def __init__(self, engine: LlamaEngine, clock=time.perf_counter) -> None:
        self.engine = engine
        self.tokens: list[int] = []
        self._proposed: tuple[int, ...] = ()
        self._sampling = SamplingParams()
        self._rng = np.random.default_rng()
        self._clock = clock

    def start(
        self, prompt_tokens: Sequence[int], sampling: SamplingParams = SamplingParams(), seed: int | None = None
    ) -> None:
        if not prompt_tokens:
            raise ValueError("the prompt must hold at least one token")
        self.tokens = [int(t) for t in prompt_tokens]
        self._proposed = ()
        self._sampling = sampling
        self._rng = np.random.default_rng(None if seed is None else seed + 1)
        self.engine.truncate(0)
        if len(self.tokens) > 1:
            self.engine.decode(self.tokens[:-1], all_logits=False)

    def propose(self, k: int) -> Proposal:
        """Draw ``k`` tokens autoregressively (the last one is not evaluated)."""
        if not self.tokens:
            raise SessionStateError("propose() before start()")
        if k < 1:
            raise ValueError("k must be >= 1")
        t0 = self._clock()
        need = len(self.tokens) - self.engine.n_past + k - 1
        if self.engine.n_past + need > self.engine.n_ctx:
            raise ContextFull("the draft's context window is full")
        catchup = self.tokens[self.engine.n_past :]
        logits = self.engine.decode(catchup, all_logits=False)[0]
        greedy = self._sampling.greedy
        proposed: list[int] = []
        dists: list[SparseDist] = []
        for i in range(k):
            if greedy:
                tok = int(np.argmax(logits))
            else:
                dist = draft_distribution(logits, self._sampling)
                tok = sample_sparse(dist, self._rng)
                dists.append(dist)
            proposed.append(tok)
            if i < k - 1:
                logits = self.engine.decode([tok], all_logits=False)[0]
        self._proposed = tuple(proposed)
        return Proposal(self._proposed, None if greedy else tuple(dists), self._clock() - t0, len(catchup))

    def commit(self, accepted: int, next_token: int) -> None:
        """The target kept ``accepted`` proposals, then ``next_token``: drop the rest from the cache."""
        if not 0 <= accepted <= len(self._proposed):
            raise SessionStateError(f"{accepted} accepted of {len(self._proposed)} proposed")
        committed = len(self.tokens)
        self.tokens += list(self._proposed[:accepted]) + [int(next_token)]
        keep = committed + min(accepted, max(len(self._proposed) - 1, 0))
        self.engine.truncate(min(self.engine.n_past, keep))
        self._proposed = ()

    def catch_up(self) -> int:
        """Evaluate the committed tokens not cached yet, all but the last (the next ``propose``
        needs its logits): a remote draft does this while the target computes, so a probe round
        after many target-alone tokens does not wait for it.  Returns how many it evaluated."""
        if self._proposed:
            raise SessionStateError("catch_up() while a proposal awaits commit()")
        todo = self.tokens[self.engine.n_past : -1]
        if not todo or self.engine.n_past + len(todo) >= self.engine.n_ctx:
            return 0
        self.engine.decode(todo, all_logits=False)
        return len(todo)

    def extend(self, tokens: Sequence[int]) -> None:
        """Tokens the target produced alone; evaluated lazily by the next ``propose``."""
        if self._proposed:
            raise SessionStateError("extend() while a proposal awaits commit()")
        self.tokens += [int(t) for t in tokens]
