"""The verifying side: one batched forward pass per round, cache rolled back past rejections.

Invariant: the KV cache holds every committed token except the last one (``pending``).
A round evaluates ``[pending] + draft`` (k + 1 tokens) in one pass; row ``i`` of the
logits is the target's next-token distribution after the first ``i`` draft tokens.
A round with no draft is one plain target step, so the fall-back path and the
speculative path share the same code.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hydra_node.runtime.child.speculative.acceptance import Verdict, check_draft_tokens, verify_greedy, verify_sampled
from hydra_node.runtime.child.speculative.llama_engine import LlamaEngine
from hydra_node.runtime.speculative.errors import ContextFull, DraftProtocolError, SessionStateError
from hydra_node.runtime.child.speculative.sampling import SamplingParams, SparseDist, target_distribution


class TargetSession:
    def __init__(self, engine: LlamaEngine) -> None:
        self.engine = engine
        self.tokens: list[int] = []  # prompt + everything committed
        self._rng = np.random.default_rng()

    def start(self, prompt_tokens: Sequence[int], seed: int | None = None) -> None:
        """Evaluate the prompt (all but its last token, which becomes pending)."""
        if not prompt_tokens:
            raise ValueError("the prompt must hold at least one token")
        if len(prompt_tokens) >= self.engine.n_ctx:
            raise ContextFull(f"a prompt of {len(prompt_tokens)} tokens leaves no room in {self.engine.n_ctx}")
        self._rng = np.random.default_rng(seed)
        self.tokens = [int(t) for t in prompt_tokens]
        self.engine.truncate(0)
        if len(self.tokens) > 1:
            self.engine.decode(self.tokens[:-1], all_logits=False)

    @property
    def room(self) -> int:
        """How many draft tokens the next round can verify within the context window."""
        return self.engine.n_ctx - self.engine.n_past - 1

    def verify(
        self,
        draft_tokens: Sequence[int],
        draft_dists: Sequence[SparseDist] | None = None,
        sampling: SamplingParams = SamplingParams(),
    ) -> Verdict:
        """Verify ``draft_tokens`` in one batched pass and commit the outcome.

        ``draft_dists`` (the draft's distribution at each position) is needed when
        sampling; greedy verification ignores it.  Untrusted draft input raises
        :class:`DraftProtocolError` before anything is evaluated.
        """
        if not self.tokens:
            raise SessionStateError("verify() before start()")
        drafts = check_draft_tokens(draft_tokens, self.engine.n_vocab)
        dists: list[SparseDist] = []
        if not sampling.greedy and drafts:
            if draft_dists is None or len(draft_dists) != len(drafts):
                raise DraftProtocolError("sampled verification needs one draft distribution per token")
            dists = [
                d if isinstance(d, SparseDist) else SparseDist.checked(*d, self.engine.n_vocab) for d in draft_dists
            ]
        if self.room < 0:
            raise ContextFull("the context window is full")
        drafts = drafts[: self.room]
        base = self.engine.n_past
        logits = self.engine.decode([self.tokens[-1]] + drafts, all_logits=True)
        if sampling.greedy:
            verdict = verify_greedy(drafts, np.argmax(logits, axis=1))
        else:
            probs = np.stack([target_distribution(row, sampling) for row in logits])
            verdict = verify_sampled(drafts, dists[: len(drafts)], probs, self._rng)
        self.engine.truncate(base + 1 + verdict.accepted)
        self.tokens += drafts[: verdict.accepted] + [verdict.next_token]
        return verdict

    def step(self, sampling: SamplingParams = SamplingParams()) -> int:
        """One plain target step (no draft): the next token."""
        return self.verify((), None, sampling).next_token
