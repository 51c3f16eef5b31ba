"""Speculation inside the batch engine, with the real bundled model as target and as its own draft.

The draft is a real :class:`DraftSession` (its own llama context); the controller is forced to
speculate (``min_speedup`` near 0, fixed k) so that every greedy step of the holder is a verify
pass inside the engine's batch.  Reference outputs come from the same engine with speculation
off, each from an empty KV cache (see ``BatchEngine.clear_cache``).
"""

from __future__ import annotations

import pytest

from hydra_node.runtime.child.process import TokenClock

pytestmark = pytest.mark.live

PROMPTS = [b"The capital of France is", b"def fib(n):", b"Ten tips for staying healthy:\n1."]
GREEDY = {"temperature": 0.0, "max_tokens": 20}


@pytest.fixture(scope="module")
def engine(model_path):
    import llama_cpp

    from hydra_node.runtime.child.engine.batch import BatchEngine
    from hydra_node.runtime.child.engine.speculation import EngineSpeculation
    from hydra_node.runtime.child.speculative.controller import ControllerConfig, SpeculationController
    from hydra_node.runtime.child.speculative.draft import DraftSession
    from hydra_node.runtime.child.speculative.llama_engine import LlamaEngine

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=1024, n_batch=128, verbose=False)
    draft = LlamaEngine(model_path, n_ctx=1024, n_threads=1)
    always = ControllerConfig(draft_min_tokens=4, draft_max_tokens=4, min_speedup=0.0, resume_speedup=0.0)
    spec = EngineSpeculation(DraftSession(draft), SpeculationController(always), "local", mixed_batches=True)
    frames: list[dict] = []
    eng = BatchEngine(llm, n_slots=4, prompt_cache=False, send=frames.append, speculation=spec)
    eng.frames, eng.spec_on = frames, spec
    yield eng
    eng.close()
    draft.close()


def run(
    eng,
    reqs: dict[int, tuple[bytes, dict]],
    *,
    speculate: bool,
    cancel_at_round: int | None = None,
    cancel: int | None = None,
) -> dict[int, dict]:
    """Submit all at once from an empty cache, step until idle; per id: text and last frame."""
    eng.clear_cache()
    eng.frames.clear()
    eng.spec = eng.spec_on if speculate else None
    try:
        for rid, (prompt, req) in reqs.items():
            eng.submit(rid, req, eng.llm.tokenize(prompt), TokenClock())
        base = eng.spec_on.controller.statistics().rounds
        while not eng.idle:
            rounds = eng.spec_on.controller.statistics().rounds - base
            eng.step()
            if cancel is not None and eng.spec_on.controller.statistics().rounds - base >= cancel_at_round > rounds:
                assert eng.spec_on.holder() == cancel
                eng.cancel(cancel)  # right after a verify pass of the holder
    finally:
        eng.spec = eng.spec_on
    out: dict[int, dict] = {}
    for f in eng.frames:
        o = out.setdefault(f["id"], {"text": "", "end": None})
        if f["op"] == "delta":
            assert o["end"] is None, "a delta after the end"
            o["text"] += f["text"]
        else:
            assert o["end"] is None, "two ends"
            o["end"] = f
    return out


def test_greedy_output_with_speculation_in_the_engine_is_the_targets(engine):
    for prompt in PROMPTS:
        ref = run(engine, {1: (prompt, GREEDY)}, speculate=False)[1]
        before = engine.spec_on.controller.statistics()
        got = run(engine, {1: (prompt, GREEDY)}, speculate=True)[1]
        after = engine.spec_on.controller.statistics()
        assert got["text"] == ref["text"], prompt
        assert got["end"]["completion_tokens"] == ref["end"]["completion_tokens"]
        assert got["end"]["finish_reason"] == ref["end"]["finish_reason"]
        assert after.rounds > before.rounds and after.accepted_tokens > before.accepted_tokens  # it did speculate
        assert got["end"]["speculative"]["in_engine"] is True


def test_one_speculating_sequence_beside_plain_ones_each_get_their_solo_output(engine):
    sampled = {"temperature": 0.8, "seed": 7, "max_tokens": 16}
    logprobs = {"temperature": 0.0, "max_tokens": 12, "logprobs": True}
    reqs = {1: (PROMPTS[0], GREEDY), 2: (PROMPTS[1], sampled), 3: (PROMPTS[2], logprobs), 4: (PROMPTS[1], GREEDY)}
    solo = {rid: run(engine, {rid: r}, speculate=False)[rid] for rid, r in reqs.items()}
    before = engine.spec_on.controller.statistics().rounds
    together = run(engine, reqs, speculate=True)
    assert engine.spec_on.controller.statistics().rounds > before  # one of the greedy ones held the draft
    for rid in reqs:
        assert together[rid]["text"] == solo[rid]["text"], rid
        assert together[rid]["end"]["completion_tokens"] == solo[rid]["end"]["completion_tokens"], rid


def test_cancelled_mid_verify_leaves_a_clean_engine(engine):
    long = {"temperature": 0.0, "max_tokens": 60}
    out = run(engine, {1: (PROMPTS[2], long), 2: (PROMPTS[0], GREEDY)}, speculate=True, cancel_at_round=2, cancel=1)
    assert out[1]["end"]["op"] == "error" and out[1]["end"]["code"] == "cancelled"
    assert out[2]["end"]["op"] == "done"
    assert engine.spec_on.holder() is None  # the draft was released
    ref = run(engine, {3: (PROMPTS[0], GREEDY)}, speculate=False)[3]
    assert out[2]["text"] == ref["text"]
    again = run(engine, {4: (PROMPTS[2], GREEDY)}, speculate=True)[4]  # the draft serves the next request
    assert again["text"] == run(engine, {5: (PROMPTS[2], GREEDY)}, speculate=False)[5]["text"]


class _DiesMidRequest:
    """The real draft, which fails (as a dropped remote draft would) on its third proposal."""

    def __init__(self, inner):
        self.inner, self.proposals = inner, 0

    def start(self, *a):
        self.inner.start(*a)

    def propose(self, k):
        self.proposals += 1
        if self.proposals == 3:
            raise ConnectionResetError("the draft went away")
        return self.inner.propose(k)

    def commit(self, *a):
        self.inner.commit(*a)

    def extend(self, tokens):
        self.inner.extend(tokens)


def test_a_draft_failing_mid_request_leaves_the_output_unchanged(engine):
    spec = engine.spec_on
    real, failures = spec.drafter, spec.draft_failures
    spec.drafter = _DiesMidRequest(real)
    try:
        got = run(engine, {1: (PROMPTS[1], GREEDY)}, speculate=True)[1]
    finally:
        spec.drafter = real
    assert spec.draft_failures == failures + 1
    assert "went away" in got["end"]["speculative"]["last_request"]["draft_failure"]
    assert got["text"] == run(engine, {2: (PROMPTS[1], GREEDY)}, speculate=False)[2]["text"]
