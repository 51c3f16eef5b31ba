"""How long a request's grammar may work: per token and per request (pure; runs inside the runner child).

llama.cpp's grammar engine keeps every way the text so far can be parsed; an ambiguous grammar (a
wide alternation under a repetition, ``^([a-z]|[a-z]|...)*$``) makes one token cost seconds, and
one C call cannot be interrupted.  So the grammar's work is timed between its C calls
(:class:`~hydra_node.runtime.child.engine.grammar.GrammarCheck` calls :meth:`GrammarBudget.check`
after each): when one token's grammar work passes ``token_s``, or the request's passes
``request_s`` (its grammar's set-up included), THAT request fails with a 422 ``grammar_too_slow``
error frame and frees its slot; the runner and the other sequences go on.  A single C call that
runs longer than the budget still runs to its end: the budget bounds what comes after it.
``[runner] grammar_token_budget_ms`` / ``grammar_request_budget_s`` (docs/config.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from hydra_node.runtime.child.engine.sampler_errors import SamplingError

__all__ = ["DEFAULT_LIMITS", "DEFAULT_REQUEST_S", "DEFAULT_TOKEN_S", "GrammarBudget", "GrammarLimits"]

#: Grammar work one token may take (a JSON schema's grammar takes a few ms per token on a CPU).
DEFAULT_TOKEN_S = 5.0
#: Grammar work one request may take, all its tokens and its grammar's set-up together.
DEFAULT_REQUEST_S = 60.0
#: The advice every ``grammar_too_slow`` message ends with.
FIX = (
    "simplify the request's response_format schema or tools: fewer alternatives and no ambiguous "
    "repetitions in a 'pattern' (e.g. '(a|a|...)*', '.*.*'), or fewer/smaller enums"
)


@dataclass(frozen=True)
class GrammarLimits:
    """``token_s``: one token's grammar work; ``request_s``: the whole request's (seconds, > 0)."""

    token_s: float = DEFAULT_TOKEN_S
    request_s: float = DEFAULT_REQUEST_S

    def __post_init__(self) -> None:
        if not (self.token_s > 0 and self.request_s > 0):
            raise ValueError(f"grammar budgets must be positive, not {self.token_s} s / {self.request_s} s")


#: The runner's defaults ([runner] grammar_token_budget_ms = 5000, grammar_request_budget_s = 60).
DEFAULT_LIMITS = GrammarLimits()


class GrammarBudget:
    """One request's grammar time: :meth:`start` a token, :meth:`check` between C calls, :meth:`stop`
    when the token is chosen; :meth:`charge` adds work done outside a token (the grammar's set-up)."""

    def __init__(self, limits: GrammarLimits, clock: Callable[[], float] = time.perf_counter):
        self.limits, self.clock = limits, clock
        self.spent = 0.0  # grammar seconds of the tokens stopped so far, set-up included
        self._t0: float | None = None

    def charge(self, seconds: float) -> None:
        self.spent += max(0.0, seconds)

    def start(self) -> None:
        self._t0 = self.clock()

    def check(self) -> None:
        """:class:`SamplingError` ``grammar_too_slow`` (422) when a budget is spent."""
        step = 0.0 if self._t0 is None else self.clock() - self._t0
        lim = self.limits
        if step > lim.token_s:
            self._t0 = None
            raise SamplingError(
                f"the grammar of this request (from its response_format or tools) took {step * 1000:.0f} ms for "
                f"one token, over the runner's budget of {lim.token_s * 1000:.0f} ms "
                f"([runner] grammar_token_budget_ms): {FIX}",
                code="grammar_too_slow",
                status=422,
            )
        if self.spent + step > lim.request_s:
            self._t0 = None
            raise SamplingError(
                f"the grammar of this request (from its response_format or tools) took "
                f"{self.spent + step:.1f} s in all, over the runner's budget of {lim.request_s:g} s per request "
                f"([runner] grammar_request_budget_s): {FIX}",
                code="grammar_too_slow",
                status=422,
            )

    def stop(self) -> None:
        """The token is chosen: its time joins the request's (:meth:`check` first)."""
        self.check()
        if self._t0 is not None:
            self.spent += self.clock() - self._t0
            self._t0 = None
