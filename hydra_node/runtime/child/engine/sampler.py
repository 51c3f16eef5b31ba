"""Per-sequence llama.cpp sampler chains (runs inside the runner child).

Each sequence gets its own native chain, so sampling a token is one C call
(``llama_sampler_sample``) over that row's logits: no Python loop over the vocabulary (with a
grammar: a few C calls and a numpy refill of the candidates).
The chain, each link present only when the request asks for it::

    logit bias -> penalties -> repeat penalty -> grammar
        -> greedy | top-k 40 -> top-p -> min-p -> temperature -> seeded draw

* logit bias (``llama_sampler_init_logit_bias``): OpenAI's ``logit_bias``, added to the logits;
* penalties (``llama_sampler_init_penalties``, repeat penalty 1.0): OpenAI's
  ``presence_penalty``/``frequency_penalty``, ``logit -= count * frequency + (count > 0) * presence``
  over the tokens this sequence has generated (the chain sees only sampled tokens, never the prompt);
* repeat penalty (llama-server's ``repeat_penalty``/``repeat_last_n``: a second penalties link with
  only its repeat argument): a token among the last ``repeat_last_n`` tokens of the prompt and the
  generated text has its logit divided by the penalty (multiplied when negative), as llama-server,
  which feeds the prompt to its sampler too; ``repeat_last_n`` 0 or a penalty of 1 is no link;
* grammar (``llama_sampler_init_grammar``, root rule ``root``): a GBNF grammar. With
  ``grammar_triggers`` it is lazy: unconstrained until the generated text contains one of the
  words, then the text from that word on must match the grammar.  For speed the grammar is
  checked beside the chain rather than inside it, with the same result
  (:mod:`hydra_node.runtime.child.engine.grammar`, which also says why not llama.cpp's lazy grammar);
* then what the runner always used: greedy when ``temperature`` is 0, else top-k → top-p →
  min-p → temperature → a seeded draw: ``top_k`` None is :data:`DEFAULT_TOP_K` (40), 0 no top-k
  link; ``min_p`` 0 is no min-p link (``llama_sampler_init_min_p(min_p, 1)``, llama-server's place
  for it: after top-p).  Greedy takes the argmax whatever top-k and min-p say (neither ever
  drops the most likely token), so they are not links of a greedy chain.  A request that asks
  for none of the extras gets exactly the chain it got before they existed (same links, same
  order), so its output is unchanged.

A request the chain cannot honour (a grammar llama.cpp cannot parse, a logit-bias token outside
the vocabulary, a malformed field) raises :class:`SamplingError`, which the engine sends as
the request's error frame (400).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hydra_node.inference.request import MAX_REPEAT_PENALTY, MAX_TOKENS_LIMIT, MAX_TOP_K

from hydra_node.runtime.child.engine.grammar import GrammarCheck, VocabText
from hydra_node.runtime.child.engine.grammar_budget import DEFAULT_LIMITS, GrammarBudget, GrammarLimits
from hydra_node.runtime.child.engine.logprobs import row_logits
from hydra_node.runtime.child.engine.sampler_errors import SamplingError

__all__ = ["DEFAULT_TOP_K", "SamplerParams", "Sampler", "SamplingError"]

#: Top-k applied before top-p when sampling with a temperature (the runner's historic default).
DEFAULT_TOP_K = 40


def _number(req: dict, key: str, default: float) -> float:
    v = req.get(key, default)
    if v is None:
        return default
    if type(v) not in (int, float) or not math.isfinite(v):
        raise SamplingError(f"'{key}' must be a number")
    return float(v)


@dataclass(frozen=True)
class SamplerParams:
    temperature: float = 0.8
    top_p: float = 0.95
    seed: int | None = None  # None: a random seed per sequence
    grammar: str = ""  # GBNF, root rule "root"; "" = unconstrained
    grammar_triggers: tuple[str, ...] = ()  # non-empty: a lazy grammar
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    top_k: int = DEFAULT_TOP_K  # 0: no top-k link
    min_p: float = 0.0  # 0: no min-p link
    repeat_penalty: float = 1.0  # 1: no repeat-penalty link
    repeat_last_n: int = 64  # the repeat penalty's window (prompt and generated tokens); 0: no link

    @classmethod
    def from_request(cls, req: dict) -> "SamplerParams":
        """From a request's wire map (``GenerationRequest.to_wire``; absent keys = defaults).
        A malformed field raises :class:`SamplingError` naming it."""
        seed = req.get("seed")
        if seed is not None and type(seed) is not int:
            raise SamplingError("'seed' must be an integer")
        grammar, triggers = req.get("grammar") or "", req.get("grammar_triggers") or []
        if not isinstance(grammar, str):
            raise SamplingError("'grammar' must be text", code="invalid_grammar")
        if not isinstance(triggers, list) or not all(isinstance(t, str) and t for t in triggers):
            raise SamplingError("'grammar_triggers' must be a list of non-empty words", code="invalid_grammar")
        if triggers and not grammar:
            raise SamplingError("'grammar_triggers' needs a grammar", code="invalid_grammar")
        bias = req.get("logit_bias") or []
        if not isinstance(bias, list) or not all(
            isinstance(e, list)
            and len(e) == 2
            and type(e[0]) is int
            and e[0] >= 0
            and type(e[1]) in (int, float)
            and math.isfinite(e[1])
            for e in bias
        ):
            raise SamplingError("'logit_bias' must map token ids to finite biases")
        top_k, last_n = req.get("top_k"), req.get("repeat_last_n", 64)
        if top_k is not None and (type(top_k) is not int or not 0 <= top_k <= MAX_TOP_K):
            raise SamplingError(f"'top_k' must be an integer from 0 to {MAX_TOP_K} or null")
        if type(last_n) is not int or not 0 <= last_n <= MAX_TOKENS_LIMIT:
            raise SamplingError(f"'repeat_last_n' must be an integer from 0 to {MAX_TOKENS_LIMIT}")
        min_p, repeat = _number(req, "min_p", 0.0), _number(req, "repeat_penalty", 1.0)
        if not 0.0 <= min_p <= 1.0:
            raise SamplingError("'min_p' must be between 0 and 1")
        if not 0.0 < repeat <= MAX_REPEAT_PENALTY:
            raise SamplingError(f"'repeat_penalty' must be greater than 0 and at most {MAX_REPEAT_PENALTY:g}")
        return cls(
            temperature=_number(req, "temperature", 0.8),
            top_p=_number(req, "top_p", 0.95),
            seed=None if seed is None else seed & 0xFFFFFFFF,
            grammar=grammar,
            grammar_triggers=tuple(triggers),
            presence_penalty=_number(req, "presence_penalty", 0.0),
            frequency_penalty=_number(req, "frequency_penalty", 0.0),
            logit_bias=tuple((int(t), float(b)) for t, b in bias),
            top_k=DEFAULT_TOP_K if top_k is None else top_k,
            min_p=min_p,
            repeat_penalty=repeat,
            repeat_last_n=last_n,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalised(self) -> bool:
        """A penalty shifts logits (OpenAI's presence/frequency, or the repeat penalty): not a plain
        argmax, so never speculated (:func:`~hydra_node.runtime.child.engine.speculation.speculation_eligible`)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repeats

    @property
    def repeats(self) -> bool:
        """The repeat-penalty link is in the chain."""
        return self.repeat_penalty != 1.0 and self.repeat_last_n > 0


class Sampler:
    """One native sampler chain; :meth:`close` frees it (idempotent).

    ``vocab``: the model's ``llama_vocab`` (grammar, vocabulary size); ``window``: how many of the
    latest generated tokens the penalties count (the sequence's token budget: all of them);
    ``grammar_limits``: how long the grammar may work per token and per request (its set-up counts);
    ``history``: the prompt's tokens, of which the repeat penalty counts the last ``repeat_last_n``
    (llama-server's semantics; the other links never see the prompt)."""

    def __init__(
        self,
        params: SamplerParams,
        vocab=None,
        window: int = 0,
        grammar_limits: GrammarLimits = DEFAULT_LIMITS,
        history: Sequence[int] = (),
    ):
        import llama_cpp

        self._ll = llama_cpp
        self.params = params
        self._limits = grammar_limits
        needs_vocab = params.grammar or params.logit_bias or params.penalised
        if needs_vocab and vocab is None:
            raise ValueError("a grammar, penalties or a logit bias need the model's vocabulary")
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab)) if needs_vocab else 0
        for tok, _ in params.logit_bias:
            if tok >= n_vocab:
                raise SamplingError(
                    f"'logit_bias' names token {tok}, outside this model's vocabulary (0..{n_vocab - 1})"
                )
        self._check: GrammarCheck | None = None
        self._pre = self._chain = None
        self._chain = chain = self._new_chain()
        if params.grammar:  # the links that shift logits apart, then _chain chooses (grammar.py)
            self._pre = self._new_chain()
        pre = chain if self._pre is None else self._pre
        add = lambda s: llama_cpp.llama_sampler_chain_add(chain, s)  # noqa: E731 - the chain owns s
        add_pre = lambda s: llama_cpp.llama_sampler_chain_add(pre, s)  # noqa: E731
        if params.logit_bias:
            arr = (llama_cpp.llama_logit_bias * len(params.logit_bias))(
                *(llama_cpp.llama_logit_bias(t, b) for t, b in params.logit_bias)
            )
            add_pre(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), arr))  # copies arr
        if params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
            add_pre(
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab, max(1, window), 1.0, params.frequency_penalty, params.presence_penalty
                )
            )
        if params.repeats:
            rep = llama_cpp.llama_sampler_init_penalties(n_vocab, params.repeat_last_n, params.repeat_penalty, 0.0, 0.0)
            for tok in history[-params.repeat_last_n :]:  # before the chain owns it: only this link sees the prompt
                llama_cpp.llama_sampler_accept(rep, tok)
            add_pre(rep)
        if params.greedy:
            add(llama_cpp.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(llama_cpp.llama_sampler_init_top_k(params.top_k))
            add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
            add(llama_cpp.llama_sampler_init_temp(params.temperature))
            seed = llama_cpp.LLAMA_DEFAULT_SEED if params.seed is None else params.seed
            add(llama_cpp.llama_sampler_init_dist(seed))
        if params.grammar:
            try:
                self._check = self._grammar(params, vocab, n_vocab)
            except BaseException:
                self.close()
                raise
        self._n_vocab = n_vocab

    def _new_chain(self):
        chain = self._ll.llama_sampler_chain_init(self._ll.llama_sampler_chain_default_params())
        if not chain:
            self.close()
            raise RuntimeError("llama_sampler_chain_init failed")
        return chain

    def _grammar(self, params: SamplerParams, vocab, n_vocab: int) -> GrammarCheck:
        ll = self._ll
        t0 = time.perf_counter()
        g = ll.llama_sampler_init_grammar(vocab, params.grammar.encode("utf-8"), b"root")
        if not g:  # llama.cpp could not parse it (its reason goes to the runner's log)
            raise SamplingError(
                "the grammar is not valid GBNF with a root rule 'root' (llama.cpp could not parse it)",
                code="invalid_grammar",
            )
        text = VocabText(vocab)
        try:
            check = GrammarCheck(
                ll,
                g,
                n_vocab=n_vocab,
                triggers=params.grammar_triggers,
                tokenize=text.tokenize,
                piece=text.piece,
                keep=1 if params.greedy else (params.top_k or n_vocab),  # top_k 0: the whole allowed vocabulary
                budget=GrammarBudget(self._limits),
            )
            assert check.budget is not None
            check.budget.charge(time.perf_counter() - t0)  # parsing it and checking its trigger words
            return check
        except BaseException:
            ll.llama_sampler_free(g)
            raise

    def sample(self, ctx, row: int) -> int:
        """Sample (and accept) a token from batch row ``row``'s logits of the last decode.
        With a grammar, :class:`SamplingError` when it leaves no token to choose."""
        if self._check is None:
            return int(self._ll.llama_sampler_sample(self._chain, ctx, row))
        return self._check.sample(self._pre, self._chain, row_logits(ctx, row, self._n_vocab))

    def advance(self, tokens) -> None:
        """Accept ``tokens`` as if this chain had sampled them, in order (a resumed generation's
        ``resume_tokens``): the penalties count them, the grammar (lazy or not) moves over them
        through our own checks, never llama.cpp's lazy grammar.  :class:`SamplingError` when the
        grammar does not allow them."""
        if self._check is not None:
            self._check.advance(self._pre, self._chain, tokens)
            return
        for tok in tokens:
            self._ll.llama_sampler_accept(self._chain, tok)

    def close(self) -> None:
        if self._check is not None:
            self._check.close()
            self._check = None
        for name in ("_pre", "_chain"):
            chain = getattr(self, name, None)
            if chain is not None:
                self._ll.llama_sampler_free(chain)
                setattr(self, name, None)
