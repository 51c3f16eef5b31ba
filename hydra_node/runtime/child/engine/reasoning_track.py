"""A reasoning sequence's state in the batch engine: its thoughts split from its answer, its
thinking budget, and a grammar that waits for the answer (runs inside the runner child).

The runner tells the engine where a chat's output starts (``req["_reasoning"]``: a
:class:`~hydra_node.runtime.child.chat_prompt.ReasoningStart`, from the rendered prompt) when the model's template
reasons; the engine then keeps one :class:`ReasoningTrack` per sequence (docs/reasoning.md):

* every piece of text the text assembler releases goes through the track's
  :class:`~hydra_node.inference.reasoning.ReasoningSplitter`: delta frames carry the thoughts
  as ``reasoning`` and only the answer as ``text``;
* ``reasoning_tokens`` (the done frame): tokens the MODEL sampled inside the block (its tags
  included). When ``thinking_budget`` of them are spent and the block is still open, the host
  writes the closing text (:func:`~hydra_node.inference.reasoning.close_text`) token by token
  instead of sampling (:meth:`ReasoningTrack.forced`); those forced tokens are completion tokens
  (they are in the output and in ``tokens``), not reasoning tokens, so a budget of N gives at
  most N reasoning tokens. A budget of 0 closes the block before the first token (a template
  whose block the model opens itself gets an empty block written, as Qwen3's switch writes it);
* a grammar (``response_format``, tools) constrains the ANSWER: until the block closes the
  sequence samples with the same chain minus the grammar (:class:`PhasedSampler`), and the
  grammar starts from the answer's first token.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from hydra_node.inference.reasoning import Phase, ReasoningSplitter, close_text
from hydra_node.runtime.child.chat_prompt import ReasoningStart
from hydra_node.runtime.child.engine.sampler import Sampler, SamplerParams
from hydra_node.runtime.child.engine.sampler_errors import SamplingError

__all__ = ["REQUEST_KEY", "ReasoningStart", "ReasoningTrack", "PhasedSampler", "budget_of", "sampler_for", "start_of"]

#: The runner's (child-internal) key on a request map: where a reasoning chat's output starts.
REQUEST_KEY = "_reasoning"


def start_of(req: dict) -> ReasoningStart | None:
    v = req.get(REQUEST_KEY)
    return v if isinstance(v, ReasoningStart) else None


def budget_of(req: dict) -> int | None:
    """The request's ``thinking_budget`` (None: only ``max_tokens`` bounds the thinking)."""
    v = req.get("thinking_budget")
    if v is not None and (type(v) is not int or v < 0):
        raise SamplingError("'thinking_budget' must be a token count or null")
    return v


class PhasedSampler:
    """Two chains for one sequence: ``thinking`` (the request's chain without its grammar) until
    :meth:`begin_answer`, then ``answer`` (the whole chain, its grammar from the first answer token)."""

    def __init__(self, thinking: Sampler, answer: Sampler):
        self._thinking: Sampler | None = thinking
        self._answer = answer
        self.params: SamplerParams = answer.params

    @property
    def answering(self) -> bool:
        return self._thinking is None

    def begin_answer(self) -> None:
        if self._thinking is not None:
            self._thinking.close()
            self._thinking = None

    def sample(self, ctx, row: int) -> int:
        return (self._thinking or self._answer).sample(ctx, row)

    def advance(self, tokens) -> None:
        (self._thinking or self._answer).advance(tokens)

    def close(self) -> None:
        if self._thinking is not None:
            self._thinking.close()
            self._thinking = None
        self._answer.close()


def sampler_for(make: Callable[[SamplerParams], Sampler], params: SamplerParams, start: ReasoningStart | None):
    """The sequence's sampler: with a grammar and a block still to come, a :class:`PhasedSampler`."""
    if start is None or not params.grammar:
        return make(params)
    splitter = ReasoningSplitter.start(start.fmt, start.opening, continuing=start.continuing)
    if splitter.phase is Phase.ANSWER:
        return make(params)
    answer = make(params)
    try:
        thinking = make(replace(params, grammar="", grammar_triggers=()))
    except BaseException:
        answer.close()
        raise
    return PhasedSampler(thinking, answer)


class ReasoningTrack:
    """One sequence's splitter, reasoning-token count and forced closing tokens.

    ``tokenize(text)``: the text's token ids (special tokens parsed: gpt-oss's markers);
    ``sampler``: the sequence's sampler, told when the answer begins."""

    def __init__(
        self,
        start: ReasoningStart,
        budget: int | None,
        tokenize: Callable[[str], list[int]],
        sampler=None,
    ):
        self.splitter = ReasoningSplitter.start(start.fmt, start.opening, continuing=start.continuing)
        self.fmt = start.fmt
        self.budget = budget
        self.tokens = 0  # reasoning tokens: sampled by the model inside the block
        self._tokenize = tokenize
        self._forced: list[int] = []
        self._closing = False
        self._sampler = sampler if isinstance(sampler, PhasedSampler) else None
        self._fed = 0  # tokens fed
        self._answer_from = 0  # tokens fed before the answer began (a resumed grammar starts there)
        #: render special tokens in the text (gpt-oss's channel markers are control tokens)
        self.special = start.fmt == "gpt-oss"
        if budget == 0 and self.splitter.phase is not Phase.ANSWER:
            self._close()
        self._answered()

    @property
    def answering(self) -> bool:
        return self.splitter.phase is Phase.ANSWER

    def forced(self) -> int | None:
        """The next token the host writes instead of sampling (None: sample)."""
        return self._forced.pop(0) if self._forced else None

    def feed(self, text: str, forced: bool) -> tuple[str, str]:
        """The text of one token (``forced``: written by the host) as ``(reasoning, answer)``."""
        before = self.splitter.phase
        reasoning, answer = self.splitter.feed(text)
        after = self.splitter.phase
        self._fed += 1
        if after is Phase.ANSWER and before is not Phase.ANSWER:
            self._answer_from = self._fed
        if not forced and (after is Phase.THINKING or (before is Phase.THINKING and after is Phase.ANSWER)):
            self.tokens += 1
        if self.budget is not None and after is Phase.THINKING and self.tokens >= self.budget:
            self._close()
        self._answered()
        return reasoning, answer

    def replayed(self, tok: int, text: str) -> tuple[str, str]:
        """A resumed token (what an earlier runner generated): fed, and taken off the forced
        tokens when it is the next of them."""
        forced = bool(self._forced) and self._forced[0] == tok
        if forced:
            self._forced.pop(0)
        return self.feed(text, forced)

    def resumed(self, tokens: list[int]) -> list[int]:
        """Of the resumed ``tokens`` (all :meth:`replayed`), those the sampler advances over: with a
        grammar that waited for the answer, the answer's only."""
        return tokens[self._answer_from :] if self._sampler is not None and self.answering else tokens

    def flush(self, text: str = "") -> tuple[str, str]:
        """The end of the output: ``text`` (what the text assembler held back), then what the
        splitter held back, decided."""
        r, a = self.splitter.feed(text)
        r2, a2 = self.splitter.flush()
        return r + r2, a + a2

    def _close(self) -> None:
        if not self._closing:
            self._closing = True
            self._forced = list(self._tokenize(close_text(self.fmt, self.splitter.phase)))

    def _answered(self) -> None:
        if self._sampler is not None and self.answering:
            self._sampler.begin_answer()
