"""Speculative decoding over the real model pair: exactness, rollback, draft failure, sampling."""

from __future__ import annotations

import pytest

from hydra_node.runtime.child.speculative.controller import ControllerConfig, SpeculationController
from hydra_node.runtime.child.speculative.draft import DraftSession, Proposal
from hydra_node.runtime.child.speculative.sampling import SamplingParams
from spec_standalone.decoder import Completion, Emitted, SpeculativeDecoder
from spec_standalone.target import TargetSession

MAX_TOKENS = 32
PROMPTS = {
    "code": "def fibonacci(n):\n",
    "prose": "The history of the Roman Empire",
    "list": "A shopping list:\n1.",
}


def fixed_k(k: int) -> SpeculationController:
    """A controller that always drafts k tokens (never falls back)."""
    return SpeculationController(ControllerConfig(draft_min_tokens=k, draft_max_tokens=k, min_speedup=0.0))


def run(decoder: SpeculativeDecoder, engine, prompt: str, max_tokens: int = MAX_TOKENS, **kw):
    events = list(decoder.generate(engine.tokenize(prompt), max_tokens=max_tokens, **kw))
    done = events[-1]
    assert isinstance(done, Completion)
    assert all(isinstance(e, Emitted) for e in events[:-1])
    tokens = [e.token for e in events[:-1]]
    text = "".join(e.text for e in events[:-1]) + done.text_tail
    assert done.completion_tokens == len(tokens)
    return tokens, text, done


class CorruptingDraft:
    """A real draft whose proposal at position ``index`` is replaced by a wrong token."""

    def __init__(self, inner: DraftSession, index: int) -> None:
        self.inner, self.index = inner, index

    def start(self, prompt, sampling, seed):
        self.inner.start(prompt, sampling, seed)

    def propose(self, k):
        p = self.inner.propose(k)
        toks = list(p.tokens)
        if self.index < len(toks):
            toks[self.index] = (toks[self.index] + 1) % self.inner.engine.n_vocab
            self.inner._proposed = tuple(toks)  # the draft's cache holds the wrong token too
        return Proposal(tuple(toks), p.dists, p.seconds)

    def commit(self, accepted, next_token):
        self.inner.commit(accepted, next_token)

    def extend(self, tokens):
        self.inner.extend(tokens)


class DyingDraft:
    """A real draft that fails (like a remote peer going away) on its n-th call, or lies."""

    def __init__(self, inner: DraftSession, die_on_propose: int, bad_token: int | None = None) -> None:
        self.inner, self.die_on, self.bad_token, self.calls = inner, die_on_propose, bad_token, 0

    def start(self, prompt, sampling, seed):
        self.inner.start(prompt, sampling, seed)

    def propose(self, k):
        self.calls += 1
        p = self.inner.propose(k)
        if self.calls == self.die_on:
            if self.bad_token is None:
                raise ConnectionResetError("draft peer went away")
            return Proposal((self.bad_token,) + p.tokens[1:], p.dists, p.seconds)
        return p

    def commit(self, accepted, next_token):
        self.inner.commit(accepted, next_token)

    def extend(self, tokens):
        self.inner.extend(tokens)


def test_plain_target_decoding_matches_llama_greedy(target_engine, reference):
    llm = target_engine.llm
    prompt = PROMPTS["code"]
    llm.reset()
    expected = []
    for tok in llm.generate(llm.tokenize(prompt.encode(), special=True), temp=0.0, repeat_penalty=1.0):
        if target_engine.is_eog(tok) or len(expected) == MAX_TOKENS:
            break
        expected.append(tok)
    llm.reset()
    target_engine.truncate(0)
    assert reference(prompt, MAX_TOKENS) == expected


@pytest.mark.parametrize("kind,k", [("code", 1), ("prose", 3), ("list", 8)])
def test_greedy_speculation_is_token_identical_to_target_alone(target_engine, draft_engine, reference, kind, k):
    dec = SpeculativeDecoder(target_engine, DraftSession(draft_engine), fixed_k(k))
    tokens, text, done = run(dec, target_engine, PROMPTS[kind])
    assert tokens == reference(PROMPTS[kind], MAX_TOKENS)
    assert text == target_engine.detokenize(tokens).decode("utf-8", errors="replace")
    assert done.rounds > 0 and done.draft_failure is None
    assert done.finish_reason == "length"


def test_rejections_happen_with_the_real_pair_and_output_stays_exact(target_engine, draft_engine, reference):
    total_drafted = total_accepted = 0
    for prompt in PROMPTS.values():
        dec = SpeculativeDecoder(target_engine, DraftSession(draft_engine), fixed_k(5))
        tokens, _, done = run(dec, target_engine, prompt)
        assert tokens == reference(prompt, MAX_TOKENS)
        total_drafted += done.drafted
        total_accepted += done.accepted
    assert 0 < total_accepted < total_drafted


def test_draft_equal_to_target_accepts_everything(target_engine, twin_engine, reference):
    dec = SpeculativeDecoder(target_engine, DraftSession(twin_engine), fixed_k(4))
    tokens, _, done = run(dec, target_engine, PROMPTS["prose"])
    assert tokens == reference(PROMPTS["prose"], MAX_TOKENS)
    assert done.drafted > 0 and done.accepted == done.drafted
    stats = dec.statistics()
    assert stats.acceptance_rate > ControllerConfig().alpha_prior
    assert stats.tokens_per_round > 4.5  # k + 1 per round but the last, cut by max_tokens


@pytest.mark.parametrize("index", [0, 2])
def test_kv_rollback_after_each_rejection_keeps_output_exact(target_engine, twin_engine, reference, index):
    """The twin agrees with the target everywhere but at the corrupted position, so every
    round accepts exactly ``index`` tokens and both caches must drop the rest."""
    dec = SpeculativeDecoder(target_engine, CorruptingDraft(DraftSession(twin_engine), index), fixed_k(4))
    tokens, _, done = run(dec, target_engine, PROMPTS["code"], max_tokens=16)
    assert tokens == reference(PROMPTS["code"], MAX_TOKENS)[:16]
    assert done.rounds >= 5
    assert done.accepted == index * done.rounds
    assert done.draft_failure is None


def test_draft_dying_mid_request_lets_the_target_finish_alone(target_engine, draft_engine, reference):
    dec = SpeculativeDecoder(target_engine, DyingDraft(DraftSession(draft_engine), die_on_propose=3), fixed_k(3))
    tokens, _, done = run(dec, target_engine, PROMPTS["list"])
    assert tokens == reference(PROMPTS["list"], MAX_TOKENS)
    assert "draft peer went away" in done.draft_failure
    assert done.rounds == 2 and done.target_steps > 0


class GarbageDraft(DyingDraft):
    """A real draft that answers its second proposal with something malformed."""

    def __init__(self, inner: DraftSession, garbage) -> None:
        super().__init__(inner, die_on_propose=2)
        self.garbage = garbage

    def propose(self, k):
        self.calls += 1
        p = self.inner.propose(k)
        return self.garbage(p, k) if self.calls == self.die_on else p


@pytest.mark.parametrize(
    "garbage",
    [
        lambda p, k: Proposal((10**9,) + p.tokens[1:], p.dists, p.seconds),  # token id out of range
        lambda p, k: Proposal(p.tokens + p.tokens, p.dists, p.seconds),  # more tokens than asked
        lambda p, k: Proposal(p.tokens, p.dists, float("nan")),  # nonsense timing
        lambda p, k: list(p.tokens),  # not a proposal at all
    ],
    ids=["bad-id", "too-many", "nan-time", "wrong-type"],
)
def test_malformed_proposal_retires_the_draft(target_engine, draft_engine, reference, garbage):
    dec = SpeculativeDecoder(target_engine, GarbageDraft(DraftSession(draft_engine), garbage), fixed_k(3))
    tokens, _, done = run(dec, target_engine, PROMPTS["code"], max_tokens=12)
    assert tokens == reference(PROMPTS["code"], MAX_TOKENS)[:12]
    assert "DraftProtocolError" in done.draft_failure
    assert done.rounds == 1


def test_sampling_path_runs_and_is_reproducible_with_a_seed(target_engine, draft_engine):
    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    outs = []
    for _ in range(2):
        dec = SpeculativeDecoder(target_engine, DraftSession(draft_engine), fixed_k(3))
        tokens, text, done = run(dec, target_engine, PROMPTS["prose"], max_tokens=16, sampling=sampling, seed=7)
        assert all(0 <= t < target_engine.n_vocab for t in tokens)
        assert done.rounds > 0 and done.draft_failure is None
        assert 0 <= done.accepted <= done.drafted
        outs.append(tokens)
    assert outs[0] == outs[1]


def test_stop_sequence_and_adaptive_controller(target_engine, draft_engine, reference):
    dec = SpeculativeDecoder(target_engine, DraftSession(draft_engine))  # adaptive k
    tokens, text, done = run(dec, target_engine, PROMPTS["code"], stop=("return",))
    assert done.finish_reason == "stop"
    assert "return" not in text
    full = target_engine.detokenize(reference(PROMPTS["code"], MAX_TOKENS)).decode()
    assert text == full[: full.index("return")]
    assert dec.statistics().target_only_tokens >= 1  # the controller measured a plain step first


def test_target_session_verify_rolls_back_its_cache(target_engine, reference):
    """verify() with a wrong middle token keeps only the agreed prefix in the cache."""
    expected = reference(PROMPTS["prose"], MAX_TOKENS)
    s = TargetSession(target_engine)
    prompt = target_engine.tokenize(PROMPTS["prose"])
    s.start(prompt)
    wrong = (expected[2] + 1) % target_engine.n_vocab
    verdict = s.verify([expected[0], expected[1], wrong, expected[3]])
    assert (verdict.accepted, verdict.next_token) == (2, expected[2])
    assert target_engine.n_past == len(prompt) + 2  # the pending token is not cached
    assert s.tokens == prompt + expected[:3]
    rest = [s.step() for _ in range(5)]
    assert rest == expected[3:8]


def test_generation_contract_adapter(target_engine, draft_engine, reference):
    from hydra_node.inference import Finished, GenerationRequest, TextDelta
    from spec_standalone.adapter import generate_events

    req = GenerationRequest(model="m", kind="completion", prompt=PROMPTS["list"], max_tokens=12, temperature=0.0)
    dec = SpeculativeDecoder(target_engine, DraftSession(draft_engine), fixed_k(3))
    events = list(generate_events(dec, req, target_engine.tokenize(req.prompt), served_by="node-a"))
    assert all(isinstance(e, TextDelta) and e.text for e in events[:-1])
    fin = events[-1]
    assert isinstance(fin, Finished) and fin.finish_reason == "length" and fin.completion_tokens == 12
    assert fin.served_by == "node-a"
    text = "".join(e.text for e in events[:-1])
    assert text == target_engine.detokenize(reference(PROMPTS["list"], MAX_TOKENS)[:12]).decode()
