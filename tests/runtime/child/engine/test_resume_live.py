"""Continuing a generation (issue 26 item 1, the runner's part) with the real bundled model, engine level.

Every delta carries the ids of the tokens behind it; a request resumed from the ids an uninterrupted
run streamed (``resume_tokens``) and the characters its client already has (``resume_skip``) gives
exactly the rest of that run: same text, same ids, one ``finish_reason``; a grammar (a JSON schema,
a lazy grammar) is advanced over the resumed tokens, a stop sequence across the cut still stops, and
resumed tokens outside the vocabulary or the context are the request's 400.

Every run starts from an empty KV cache (``clear_cache``): the cache's occupancy can change the last
bits of greedy logits (batch.py).  The resumed tokens are prefilled in one batch where the
uninterrupted run decoded them one by one; on this CPU build with the bundled model the greedy
outputs compared here are identical, but with another backend or model a near tie may part there.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from hydra_node.grammar.constraints import json_schema_grammar
from hydra_node.runtime.child.process import TokenClock

pytestmark = pytest.mark.live

MAX = 32
#: its greedy answer: Japanese characters, most of two tokens (a cut may fall inside a character)
JAPANESE = "Say hello in Japanese and Chinese."
COUNT = b"1, 2, 3, 4,"  # greedy: " 5, 6, 7, 8, ..."
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def engine(model_path):
    import llama_cpp

    from hydra_node.runtime.child.engine.batch import BatchEngine
    from hydra_node.runtime.child.main import _chat_formatter

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=1024, n_batch=256, verbose=False)
    frames: list[dict] = []
    eng = BatchEngine(llm, n_slots=2, prompt_cache=True, send=frames.append)
    eng.frames, eng.chat = frames, _chat_formatter(llm)
    yield eng
    eng.close()


def chat_tokens(eng, text: str) -> list[int]:
    r = eng.chat.render({"kind": "chat", "messages": [["user", text]]})
    return eng.llm.tokenize(r.text.encode(), add_bos=not r.added_special, special=True)


def run(eng, tokens: list[int], **req) -> tuple[list[dict], dict]:
    """One request from an empty KV cache: its delta frames and its last frame."""
    eng.frames.clear()
    eng.submit(1, {"temperature": 0.0, "max_tokens": MAX, **req}, tokens, TokenClock())
    while not eng.idle:
        eng.step()
    eng.clear_cache()
    return [f for f in eng.frames if f["op"] == "delta"], eng.frames[-1]


def ids(deltas: list[dict]) -> list[int]:
    return [t for d in deltas for t in d.get("tokens", [])]


def text(deltas: list[dict]) -> str:
    return "".join(d["text"] for d in deltas)


def resume_at(eng, tokens: list[int], deltas: list[dict], k: int, **req) -> tuple[str, list[dict], dict]:
    """Resume from the first ``k`` ids the run streamed, as a router that received the deltas up to
    the one holding id ``k - 1`` would: (the text it had, the resumed deltas, their end)."""
    got, n = "", 0
    for d in deltas:
        if n >= k:
            break
        got, n = got + d["text"], n + len(d.get("tokens", []))
    first = ids(deltas)
    more, end = run(eng, tokens, **{**req, "resume_tokens": first[:k], "resume_skip": len(got)})
    return got, more, end


@pytest.fixture(scope="module")
def japanese(engine) -> tuple[list[int], list[dict], dict]:
    """The uninterrupted greedy chat: its prompt, its deltas, its done frame."""
    tokens = chat_tokens(engine, JAPANESE)
    return (tokens, *run(engine, tokens))


def test_the_deltas_ids_are_the_generated_tokens_and_their_text_the_streamed_text(engine, japanese):
    _, deltas, end = japanese
    assert end["op"] == "done" and end["finish_reason"] == "length", end
    streamed = ids(deltas)
    assert len(streamed) == end["completion_tokens"] == MAX
    assert any(len(d["tokens"]) > 1 for d in deltas)  # held-back bytes ride with the next delta
    assert engine.llm.detokenize(streamed).decode("utf-8", "replace") == text(deltas)
    stopped, end = run(engine, list(engine.llm.tokenize(COUNT)), stop=[", 8"])
    assert end["finish_reason"] == "stop" and text(stopped) == " 5, 6, 7"  # the stop's tokens still counted:
    assert len(ids(stopped)) == end["completion_tokens"] and engine.llm.detokenize(ids(stopped)).decode() == (
        " 5, 6, 7, 8"
    )


@pytest.mark.parametrize("k", [1, 2, 3, 16, 31])
def test_a_resumed_greedy_chat_gives_exactly_the_rest_of_the_uninterrupted_run(engine, japanese, k):
    """k = 1 and 3 fall inside a two-token character, 2 right after one; 31 leaves one token."""
    tokens, deltas, end = japanese
    got, more, end2 = resume_at(engine, tokens, deltas, k, max_tokens=MAX - k)
    assert got + text(more) == text(deltas)
    assert ids(more) == ids(deltas)[k:]
    assert end2["op"] == "done" and end2["finish_reason"] == end["finish_reason"] == "length", end2
    assert (end2["prompt_tokens"], end2["completion_tokens"]) == (end["prompt_tokens"], MAX - k)


def test_a_resumed_json_schema_output_still_parses_and_validates(engine):
    tokens = chat_tokens(engine, "Describe a person as JSON.")
    req = {"grammar": json_schema_grammar(SCHEMA, param="response_format"), "max_tokens": 60}
    deltas, end = run(engine, tokens, **req)
    assert end["finish_reason"] == "stop", end
    jsonschema.validate(json.loads(text(deltas)), SCHEMA)
    n = len(ids(deltas))
    for k in (n // 3, 2 * n // 3):
        got, more, end2 = resume_at(engine, tokens, deltas, k, **{**req, "max_tokens": 60 - k})
        full = got + text(more)
        assert full == text(deltas) and end2["finish_reason"] == "stop", (k, full)
        jsonschema.validate(json.loads(full), SCHEMA)


def test_a_lazy_grammar_resumed_before_and_after_its_trigger(engine):
    tokens = list(engine.llm.tokenize(COUNT))
    req = {"grammar": 'root ::= "6" [a-z]+', "grammar_triggers": ["6"], "max_tokens": 12}
    deltas, _ = run(engine, tokens, **req)
    assert text(deltas).startswith(" 5, 6") and text(deltas)[5:].isalpha(), deltas  # free, then the grammar
    for k in (1, 5):
        got, more, _ = resume_at(engine, tokens, deltas, k, **{**req, "max_tokens": 12 - k})
        assert got + text(more) == text(deltas) and ids(more) == ids(deltas)[k:], k


def test_a_stop_sequence_across_the_cut_still_stops(engine):
    tokens = list(engine.llm.tokenize(COUNT))
    stop = {"stop": [", 7"], "max_tokens": 10}
    deltas, end = run(engine, tokens, **stop)
    assert text(deltas) == " 5, 6" and end["finish_reason"] == "stop"
    pieces = [engine.llm.detokenize([t]).decode() for t in ids(deltas)]
    assert pieces[-3:] == [",", " ", "7"], pieces  # the stop's tokens: ", " held back, then "7" completed it
    n = len(pieces)
    for at in (n - 2, n - 1):  # resume with "," or ", " (held back): the stop sequence spans the cut
        got, more, end2 = resume_at(engine, tokens, deltas, at, **{**stop, "max_tokens": 10 - at})
        assert got == " 5, 6" and text(more) == "" and end2["finish_reason"] == "stop", (got, more, end2)
        assert end2["completion_tokens"] == n - at and ids(more) == ids(deltas)[at:]  # generated here
    # the stop sequence completed inside the resumed tokens: finished at once, nothing generated
    _, more, end3 = resume_at(engine, tokens, deltas, n, **{**stop, "max_tokens": 10 - n})
    assert (end3["op"], end3["finish_reason"], end3["completion_tokens"], text(more)) == ("done", "stop", 0, "")


def test_resumed_tokens_outside_the_vocabulary_or_the_context_are_the_requests_400(engine):
    tokens = list(engine.llm.tokenize(COUNT))
    _, end = run(engine, tokens, resume_tokens=[5, engine.n_vocab])
    assert (end["op"], end["status"]) == ("error", 400) and "resume_tokens[1]" in end["message"], end
    _, end = run(engine, tokens, resume_tokens=[5] * (engine.n_ctx - len(tokens)))
    assert (end["op"], end["status"], end["code"]) == ("error", 400, "context_length_exceeded"), end
    assert "resume_tokens" in end["message"]
    _, end = run(
        engine, tokens, grammar='root ::= "yes" | "no"', resume_tokens=list(engine.llm.tokenize(b" 5", add_bos=False))
    )
    assert (end["op"], end["code"]) == ("error", "invalid_grammar") and "resume_tokens[0]" in end["message"], end
    _, end = run(engine, tokens, max_tokens=2)  # the engine serves on
    assert end["op"] == "done"
