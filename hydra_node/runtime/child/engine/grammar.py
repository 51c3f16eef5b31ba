"""A sequence's grammar, checked beside its native sampler chain (runs inside the runner child).

Applying a GBNF grammar to every candidate of a 49k-token vocabulary costs about as much as the
decode step of a small model, so the grammar is not a link of the chain.  The chain is split in
two: ``pre`` (logit bias, penalties: they only shift logits) and ``post`` (greedy, or top-k →
top-p → temperature → draw: they choose).  Each token:

1. the candidates get the row's logits, ``pre`` shifts them, ``post`` picks a token;
2. the grammar checks that ONE token (as llama.cpp's ``common_sampler`` does); allowed: done;
3. else the most likely candidates (by shifted logit) are checked one by one, cheaply, until
   ``post`` has what it would keep from a grammar-filtered vocabulary (the best allowed token for
   greedy, the best ``top_k`` allowed for sampling); ``post`` chooses among those.  Only when the
   best :data:`SCAN` candidates do not hold enough is the grammar applied to the whole vocabulary.

Either way the result is ``post``'s choice among the tokens the grammar allows, exactly as with
the grammar inside the chain before ``post``: for greedy decoding the best allowed token, for
sampling a draw from top-k/top-p of the allowed tokens.  No Python loop runs over the vocabulary
(numpy refills the candidates; the scan checks at most :data:`SCAN` tokens).

Lazy grammars (``grammar_triggers``) are watched here too, not with llama.cpp's
``llama_sampler_init_grammar_lazy*``: 0.3.36's lazy grammar feeds the text from the trigger on
to the grammar unchecked, and a piece the grammar rejects throws a C++ exception through the C
API, which aborts the whole runner process (seen with the bundled model).  Here a token that
would complete a trigger word is kept only if the grammar accepts the text from the word on
(checked on a clone of the grammar); otherwise the token is banned and the chain picks again.
Before that the text is free; from then on the grammar constrains every token.  A grammar that
leaves no token at all (or rejects every way to complete a trigger) ends that request with a 400
``invalid_grammar`` error, never a crash.

The grammar's work is timed between its C calls (:mod:`~hydra_node.runtime.child.engine.grammar_budget`):
a token whose grammar work passes the per-token budget, or a request whose grammar work passes the
per-request one, ends THAT request with a 422 ``grammar_too_slow`` error; the scan stops at the
first check past the budget.
"""

from __future__ import annotations

import ctypes

import numpy as np

from hydra_node.runtime.child.engine.grammar_budget import GrammarBudget
from hydra_node.runtime.child.engine.sampler_errors import SamplingError
from hydra_node.runtime.child.textstream import Trigger, TriggerWatch

__all__ = ["GrammarCheck", "MAX_TRIGGER_RETRIES", "SCAN", "VocabText"]

#: Tokens banned, one after another, because they would start a lazy grammar with text it rejects.
MAX_TRIGGER_RETRIES = 16
#: The most likely candidates checked one by one before the grammar is applied to the whole vocabulary.
SCAN = 512
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data


class VocabText:
    """Text <-> tokens as the output sees them: a token's bytes as the engine's deltas render it
    (special tokens not rendered), text tokenised without BOS or special-token parsing."""

    def __init__(self, vocab) -> None:
        import llama_cpp

        self.ll, self.vocab = llama_cpp, vocab
        self._buf = ctypes.create_string_buffer(256)
        self._pieces: dict[int, bytes] = {}

    def piece(self, tok: int) -> bytes:
        hit = self._pieces.get(tok)
        if hit is None:
            n = int(self.ll.llama_token_to_piece(self.vocab, tok, self._buf, len(self._buf), 0, False))
            if n < 0:  # longer than the buffer: ask again with room for it
                buf = ctypes.create_string_buffer(-n)
                n = int(self.ll.llama_token_to_piece(self.vocab, tok, buf, -n, 0, False))
                hit = buf.raw[:n]
            else:
                hit = self._buf.raw[:n]
            self._pieces[tok] = hit
        return hit

    def tokenize(self, text: bytes) -> list[int]:
        cap = len(text) + 8
        buf = (self.ll.llama_token * cap)()
        n = int(self.ll.llama_tokenize(self.vocab, text, len(text), buf, cap, False, False))
        if n < 0:
            raise ValueError(f"tokenising {len(text)} bytes needs {-n} tokens")
        return list(buf[:n])


class _Candidates:
    """A reusable ``llama_token_data_array`` over the whole vocabulary."""

    def __init__(self, ll, n_vocab: int):
        self.ll, self.n = ll, n_vocab
        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.arr = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self.cur = ll.llama_token_data_array(self.arr.ctypes.data_as(ll.llama_token_data_p), n_vocab, -1, False)
        self.ref = ctypes.byref(self.cur)

    def load(self, logits: np.ndarray, banned: list[int]) -> None:
        a = self.arr  # the chain may have sorted and cut the previous use
        a["id"], a["logit"], a["p"] = self.ids, logits, 0.0
        if banned:
            a["logit"][banned] = -np.inf
        self.cur.size, self.cur.selected, self.cur.sorted = self.n, -1, False

    def load_subset(self, ids: np.ndarray, logits: np.ndarray) -> None:
        a, k = self.arr, len(ids)
        a["id"][:k], a["logit"][:k], a["p"][:k] = ids, logits, 0.0
        self.cur.size, self.cur.selected, self.cur.sorted = k, -1, False

    def apply(self, sampler) -> None:
        self.ll.llama_sampler_apply(sampler, self.ref)

    def run(self, sampler) -> int:
        self.ll.llama_sampler_apply(sampler, self.ref)
        if not 0 <= self.cur.selected < self.cur.size:
            raise RuntimeError("the sampler chain selected no token")
        return int(self.arr["id"][self.cur.selected])


class GrammarCheck:
    """Owns the grammar sampler ``grammar`` (a plain, non-lazy one) and frees it in :meth:`close`."""

    def __init__(
        self,
        ll,
        grammar,
        *,
        n_vocab: int,
        triggers: tuple[str, ...],
        tokenize,
        piece,
        keep: int,
        budget: GrammarBudget | None = None,
    ):
        """``keep``: how many of the best allowed candidates ``post`` needs (1 for greedy, its top-k);
        ``budget``: the request's grammar time (None: unbounded)."""
        self.ll, self.grammar, self.keep, self.budget = ll, grammar, keep, budget
        self.tokenize, self.piece = tokenize, piece  # text -> token ids; token -> bytes (as in the output)
        self.cand = _Candidates(ll, n_vocab)
        self._one = ll.llama_token_data(0, 0.0, 0.0)
        self._one_arr = ll.llama_token_data_array(ctypes.pointer(self._one), 1, -1, False)
        self.watch = TriggerWatch(triggers) if triggers else None  # None: the grammar is active
        for word in triggers:  # the grammar must accept each word as its beginning
            g = ll.llama_sampler_clone(grammar)
            ok = self._feed(g, self.tokenize(word.encode("utf-8")))
            ll.llama_sampler_free(g)
            if not ok:
                raise SamplingError(
                    f"the grammar does not start with the trigger word {word!r:.60}: a lazy grammar "
                    "must accept the text from its trigger word on",
                    code="invalid_grammar",
                )

    @property
    def active(self) -> bool:
        return self.watch is None

    def allows(self, g, tok: int) -> bool:
        one = self._one
        one.id, one.logit, one.p = tok, 1.0, 0.0
        self._one_arr.size, self._one_arr.selected, self._one_arr.sorted = 1, -1, False
        self.ll.llama_sampler_apply(g, ctypes.byref(self._one_arr))
        return one.logit != float("-inf")

    def _feed(self, g, tokens) -> bool:
        """Accept ``tokens`` into grammar ``g`` if it allows each in turn (else False, ``g`` spoilt)."""
        for t in tokens:
            if not self.allows(g, t):
                return False
            self.ll.llama_sampler_accept(g, t)
        return True

    def sample(self, pre, post, logits: np.ndarray) -> int:
        """``post``'s choice, after ``pre``, among the tokens the grammar allows; accepted by all three.
        :class:`SamplingError` ``grammar_too_slow`` when the grammar's work passes its budget."""
        if self.budget is not None:
            self.budget.start()
        tok = self._sample_active(pre, post, logits) if self.active else self._sample_watching(pre, post, logits)
        self.ll.llama_sampler_accept(pre, tok)
        self.ll.llama_sampler_accept(post, tok)
        if self.budget is not None:
            self.budget.stop()
        return tok

    def advance(self, pre, post, tokens) -> None:
        """Accept ``tokens`` into ``pre``, ``post`` and the grammar as :meth:`sample` would have, had
        it chosen them (a resumed generation): a lazy grammar watches them for its trigger word and
        starts on a clone only if it accepts the text from the word on.  :class:`SamplingError`
        (400 ``invalid_grammar``) naming ``resume_tokens`` when the grammar does not allow them."""
        for i, tok in enumerate(tokens):
            if self.active:
                if not self.allows(self.grammar, tok):
                    raise SamplingError(
                        f"resume_tokens[{i}] ({tok}) is not allowed by the request's grammar here",
                        code="invalid_grammar",
                    )
                self.ll.llama_sampler_accept(self.grammar, tok)
            else:
                watch = self.watch
                assert watch is not None  # not active yet
                piece = self.piece(tok)
                hit = watch.find(tok, piece)
                if hit is None:
                    watch.commit(tok, piece)
                elif not self._start(hit):
                    raise SamplingError(
                        f"resume_tokens[{i}] ({tok}) completes the trigger word {hit.word!r:.40} with text "
                        "the request's grammar rejects",
                        code="invalid_grammar",
                    )
            self.ll.llama_sampler_accept(pre, tok)
            self.ll.llama_sampler_accept(post, tok)

    def _tick(self) -> None:
        """Between two grammar C calls: fail the request if its grammar time is spent."""
        if self.budget is not None:
            self.budget.check()

    def _sample_active(self, pre, post, logits: np.ndarray) -> int:
        c = self.cand
        c.load(logits, [])
        c.apply(pre)  # shifts logits in place: no reordering, no cut
        shifted = c.arr["logit"].copy()
        tok = c.run(post)
        allowed = self.allows(self.grammar, tok)
        self._tick()
        if not allowed:
            tok = self._constrained(post, shifted)
        self.ll.llama_sampler_accept(self.grammar, tok)
        return tok

    def _constrained(self, post, shifted: np.ndarray) -> int:
        """``post``'s choice among the allowed tokens, from the best ``keep`` of them."""
        c, scan = self.cand, min(SCAN, len(shifted))
        best = np.argpartition(-shifted, scan - 1)[:scan]
        best = best[np.argsort(-shifted[best], kind="stable")]
        allowed = []
        for t in best.tolist():
            if shifted[t] == -np.inf:
                break
            ok = self.allows(self.grammar, t)
            self._tick()
            if ok:
                allowed.append(t)
                if len(allowed) == self.keep:
                    break
        if len(allowed) == self.keep:
            ids = np.asarray(allowed, dtype=np.int32)
            c.load_subset(ids, shifted[ids])
        else:  # the grammar allows few of the likely tokens: filter the whole vocabulary
            c.load(shifted, [])
            c.apply(self.grammar)
            self._tick()
        tok = c.run(post)
        if not self.allows(self.grammar, tok):
            raise SamplingError("the grammar allows no token here", code="invalid_grammar")
        return tok

    def _sample_watching(self, pre, post, logits: np.ndarray) -> int:
        banned: list[int] = []
        watch = self.watch
        assert watch is not None  # not active yet (only a successful _start clears it, and returns)
        for _ in range(MAX_TRIGGER_RETRIES):
            self._tick()
            self.cand.load(logits, banned)
            self.cand.apply(pre)
            tok = self.cand.run(post)
            piece = self.piece(tok)
            hit = watch.find(tok, piece)
            if hit is None:
                watch.commit(tok, piece)
                return tok
            if self._start(hit):
                return tok
            banned.append(tok)
        raise SamplingError(
            f"every likely token that completes a trigger word continues it with text the grammar "
            f"rejects ({MAX_TRIGGER_RETRIES} tried)",
            code="invalid_grammar",
        )

    def _start(self, hit: Trigger) -> bool:
        """Start the grammar with the text from the trigger word on, if it accepts it."""
        try:
            hit.lead.decode("utf-8")
        except UnicodeDecodeError:  # the token ends inside a character: its tail cannot be tokenised alone
            return False
        lead = self.tokenize(hit.lead) if hit.lead else []
        if b"".join(self.piece(t) for t in lead) != hit.lead:
            return False  # the tail of a token that does not tokenise back to itself: cannot feed it
        g = self.ll.llama_sampler_clone(self.grammar)
        if not self._feed(g, [*lead, *hit.tokens]):
            self.ll.llama_sampler_free(g)
            return False
        self.ll.llama_sampler_free(self.grammar)
        self.grammar, self.watch = g, None
        return True

    def close(self) -> None:
        if self.grammar is not None:
            self.ll.llama_sampler_free(self.grammar)
            self.grammar = None
