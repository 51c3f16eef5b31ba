"""Prefix sharing across slots with the real model: a second request whose prompt starts with what a
generating slot holds copies those cells (llama_memory_seq_cp) instead of evaluating them again,
and its greedy output is the one it gets when it evaluates its whole prompt itself."""

from __future__ import annotations

import pytest

from hydra_node.runtime.child.process import TokenClock

pytestmark = pytest.mark.live

SYSTEM = b"You are a careful assistant. Answer briefly and precisely. Use plain words. " * 4
GREEDY = {"temperature": 0.0, "max_tokens": 8}


def _engine(model_path, **options):
    import llama_cpp

    from hydra_node.runtime.child.engine.batch import BatchEngine

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=1024, n_batch=128, verbose=False)
    frames: list[dict] = []
    eng = BatchEngine(llm, n_slots=2, prompt_cache=True, send=frames.append, min_shared_tokens=16, **options)
    eng.frames = frames
    return eng


def _text(frames: list[dict], rid: int) -> tuple[str, dict]:
    return (
        "".join(f["text"] for f in frames if f["id"] == rid and f["op"] == "delta"),
        next(f for f in frames if f["id"] == rid and f["op"] in ("done", "error")),
    )


def _second_after_first_prefilled(eng) -> tuple[str, dict]:
    """Request 1 (system + question A) runs; once it is decoding, request 2 (system + B) joins."""
    tok = eng.llm.tokenize
    eng.submit(1, {**GREEDY, "max_tokens": 40}, tok(SYSTEM + b"Question: what is 2+2?"), TokenClock())
    while not eng.sched.statistics().active or eng.sched._active[1].prefilled < len(eng.sched.prompt_of(1)):
        eng.step()
    eng.submit(2, GREEDY, tok(SYSTEM + b"Question: name a colour."), TokenClock())
    while not eng.idle:
        eng.step()
    return _text(eng.frames, 2)


def test_a_shared_prefix_is_copied_and_the_output_is_unchanged(model_path):
    shared = _engine(model_path)
    try:
        text, done = _second_after_first_prefilled(shared)
        st = shared.statistics()
        assert st.prefix_shared == 1 and done["cached_tokens"] >= 60  # the system prompt was not evaluated again
    finally:
        shared.close()
    alone = _engine(model_path, share_prefixes=False)
    try:
        ref_text, ref_done = _second_after_first_prefilled(alone)
        assert alone.statistics().prefix_shared == 0 and ref_done["cached_tokens"] == 0
    finally:
        alone.close()
    assert text == ref_text and done["completion_tokens"] == ref_done["completion_tokens"]


def test_siblings_submitted_together_evaluate_the_prompt_once(model_path):
    """Two requests with one long prompt submitted together (OpenAI n = 2 fans out like this): one
    prefill and one copy, and each greedy answer is the one the prompt gets alone."""
    eng = _engine(model_path)
    try:
        prompt = eng.llm.tokenize(SYSTEM + b"Question: name a colour.")
        eng.submit(9, GREEDY, prompt, TokenClock())  # alone first: the reference
        while not eng.idle:
            eng.step()
        ref, _ = _text(eng.frames, 9)
        eng.clear_cache()
        eng.frames.clear()
        base = eng.statistics()
        for rid in (1, 2):
            eng.submit(rid, GREEDY, prompt, TokenClock())
        while not eng.idle:
            eng.step()
        st = eng.statistics()
        texts = [_text(eng.frames, rid) for rid in (1, 2)]
        assert st.prefix_shared - base.prefix_shared == 1
        assert [t for t, _ in texts] == [ref, ref]
        assert texts[1][1]["cached_tokens"] == len(prompt) - 1 and texts[0][1]["cached_tokens"] == 0
    finally:
        eng.close()
