"""The batch engine with the real bundled model, then through a real node.

Engine level (one llama.cpp context, no process): eight concurrent streams with correct usage,
a cancellation mid-batch that leaves the other streams byte-identical, and greedy output that
is the same alone and inside a full batch.  Node level: kill -9 of the runner mid-batch gives
every in-flight request a clean error and the next request succeeds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading

import pytest

from harness import NodeProcess, request
from hydra_node.models import BUNDLED_MODEL_ID
from hydra_node.runtime.child.process import TokenClock

pytestmark = pytest.mark.live

SLOTS = 8
PROMPTS = [
    b"The capital of France is",
    b"Once upon a time",
    b"1, 2, 3, 4,",
    b"def fib(n):",
    b"The quick brown fox",
    b"Water boils at",
    b"My favourite colour is",
    b"In 1492, Columbus",
]
GREEDY = {"temperature": 0.0, "max_tokens": 12}


@pytest.fixture(scope="module")
def engine(model_path):
    import llama_cpp

    from hydra_node.runtime.child.engine.batch import BatchEngine

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=2048, n_batch=256, verbose=False)
    frames: list[dict] = []
    eng = BatchEngine(llm, n_slots=SLOTS, prompt_cache=False, send=frames.append)
    eng.frames = frames
    yield eng
    eng.close()


def run(eng, reqs: dict[int, tuple[bytes, dict]], cancel_after: dict[int, int] | None = None) -> dict[int, dict]:
    """Submit every request at once, step until idle; per id: its text and its last frame."""
    eng.frames.clear()
    for rid, (prompt, req) in reqs.items():
        eng.submit(rid, req, eng.llm.tokenize(prompt), TokenClock())
    step = 0
    while not eng.idle:
        eng.step()
        step += 1
        for rid, at in (cancel_after or {}).items():
            if step == at:
                eng.cancel(rid)
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


def test_every_sequence_may_use_the_whole_unified_cache(engine):
    assert engine.n_ctx == 2048 and engine._ll.llama_n_ctx_seq(engine.ctx) == engine.n_ctx  # kv_unified
    assert engine.ctx_per_slot == engine.n_ctx  # the most one request may use


def test_eight_concurrent_streams_finish_with_correct_usage(engine):
    out = run(engine, {i: (p, GREEDY) for i, p in enumerate(PROMPTS, 1)})
    assert sorted(out) == list(range(1, 9))
    for i, p in enumerate(PROMPTS, 1):
        end = out[i]["end"]
        assert end["op"] == "done", end
        assert end["prompt_tokens"] == len(engine.llm.tokenize(p))
        assert end["finish_reason"] in ("length", "stop")
        if end["finish_reason"] == "length":
            assert end["completion_tokens"] == GREEDY["max_tokens"]
        assert out[i]["text"]
    st = engine.statistics()  # the figures the runner reports to the node (its stats frames)
    assert (st.active, st.free_slots, st.n_slots) == (0, SLOTS, SLOTS) and st.kv_used == 0
    assert st.steps >= GREEDY["max_tokens"] and 1 < st.batch_mean <= SLOTS, st
    assert st.prefill_tokens_per_s > 0 and st.decode_tokens_per_s > 0, st


def test_greedy_output_is_the_same_alone_and_in_a_full_batch(engine):
    batched = run(engine, {i: (p, GREEDY) for i, p in enumerate(PROMPTS, 1)})
    for i, p in enumerate(PROMPTS, 1):
        alone = run(engine, {100 + i: (p, GREEDY)})[100 + i]
        assert alone["text"] == batched[i]["text"], p
        assert alone["end"]["completion_tokens"] == batched[i]["end"]["completion_tokens"]


def test_cancel_mid_batch_leaves_the_others_byte_identical(engine):
    reqs = {i: (p, GREEDY) for i, p in enumerate(PROMPTS[:4], 1)}
    reqs[2] = (PROMPTS[1], {"temperature": 0.0, "max_tokens": 200})
    full = run(engine, {k: v for k, v in reqs.items() if k != 2})
    cut = run(engine, reqs, cancel_after={2: 4})
    assert cut[2]["end"]["op"] == "error" and cut[2]["end"]["code"] == "cancelled"
    for k in (1, 3, 4):
        assert cut[k]["text"] == full[k]["text"]
        assert {x: cut[k]["end"][x] for x in ("finish_reason", "prompt_tokens", "completion_tokens")} == {
            x: full[k]["end"][x] for x in ("finish_reason", "prompt_tokens", "completion_tokens")
        }


def test_stop_string_and_too_long_prompt(engine):
    out = run(
        engine,
        {1: (b"1, 2, 3, 4,", {"temperature": 0.0, "max_tokens": 40, "stop": [" 7"]}), 2: (b"word " * 2100, GREEDY)},
    )  # more than the whole context
    assert out[1]["end"]["finish_reason"] == "stop" and "7" not in out[1]["text"]
    assert out[2]["end"]["op"] == "error" and out[2]["end"]["code"] == "context_length_exceeded"


# ---- the KV budget: a small context, so long prompts are cheap ----------------------------------

SMALL_CTX, SMALL_SLOTS = 256, 4  # ctx_size / parallel = 64 tokens


@pytest.fixture(scope="module")
def small(model_path):
    import llama_cpp

    from hydra_node.runtime.child.engine.batch import BatchEngine

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=SMALL_CTX, n_batch=64, verbose=False)
    frames: list[dict] = []
    eng = BatchEngine(llm, n_slots=SMALL_SLOTS, prompt_cache=False, send=frames.append)
    eng.frames = frames
    yield eng
    eng.close()


def staggered(eng, first: tuple[bytes, dict], second: tuple[bytes, dict], after: int) -> dict[int, dict]:
    """Request 1 starts alone; request 2 joins after ``after`` steps, while 1 is generating."""
    eng.frames.clear()
    eng.submit(1, first[1], eng.llm.tokenize(first[0]), TokenClock())
    for _ in range(after):
        eng.step()
    assert not eng.idle, "request 1 ended before request 2 joined"
    eng.submit(2, second[1], eng.llm.tokenize(second[0]), TokenClock())
    while not eng.idle:
        eng.step()
        st = eng.statistics()
        assert st.kv_used <= st.kv_budget == SMALL_CTX
    out: dict[int, dict] = {}
    for f in eng.frames:
        o = out.setdefault(f["id"], {"text": "", "end": None})
        if f["op"] == "delta":
            o["text"] += f["text"]
        else:
            o["end"] = f
    return out


def test_a_prompt_longer_than_ctx_over_parallel_succeeds_while_another_stream_runs(small):
    long_prompt = b"The history of the city, told year by year: " + b"and then it rained again, " * 25
    n = len(small.llm.tokenize(long_prompt))
    assert SMALL_CTX // SMALL_SLOTS < n < SMALL_CTX - 40
    stream = (b"1, 2, 3, 4,", {"temperature": 0.0, "max_tokens": 30})
    out = staggered(small, stream, (long_prompt, {"temperature": 0.0, "max_tokens": 8}), after=3)
    assert out[2]["end"]["op"] == "done", out[2]["end"]
    assert out[2]["end"]["prompt_tokens"] == n and out[2]["end"]["completion_tokens"] >= 1
    alone = staggered(small, stream, (b"x", {"temperature": 0.0, "max_tokens": 1}), after=1)
    assert out[1]["text"] == alone[1]["text"] and out[1]["end"]["finish_reason"] == "length"


def test_a_full_cache_cuts_the_younger_stream_and_leaves_the_older_intact(small):
    # 1: ~150 prompt cells + up to 79 decoded; 2: ~60 + up to 79: together more than 256 cells
    older = (b"Chapter one. " + b"It was a long and quiet afternoon, " * 18, {"temperature": 0.0, "max_tokens": 80})
    younger = (b"Chapter two. " + b"the rain kept falling, " * 10, {"temperature": 0.0, "max_tokens": 80})
    assert len(small.llm.tokenize(older[0])) + len(small.llm.tokenize(younger[0])) + 2 * 79 > SMALL_CTX
    out = staggered(small, older, younger, after=4)
    end1, end2 = out[1]["end"], out[2]["end"]
    assert end2["op"] == "done" and end2["finish_reason"] == "length" and end2["completion_tokens"] < 80, end2
    alone = staggered(small, older, (b"x", {"temperature": 0.0, "max_tokens": 1}), after=4)
    assert end1["op"] == "done" and out[1]["text"] == alone[1]["text"]  # its KV was never touched
    assert end1["completion_tokens"] == alone[1]["end"]["completion_tokens"]


# ---- through a real node ---------------------------------------------------------------------

LONG = {"model": BUNDLED_MODEL_ID, "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 3000, "temperature": 0, "stream": True}


def test_kill_9_mid_batch_fails_every_stream_cleanly_and_the_next_request_succeeds(tmp_path):
    cfg = tmp_path / "hydra.toml"
    cfg.write_text("[defaults.throughput]\nparallel = 4\n")
    node = NodeProcess(tmp_path / "home", "--config", str(cfg)).start()
    try:
        st = node.status()
        assert st["models"][0]["engine"]["mode"] == "continuous_batching"
        assert st["models"][0]["engine"]["parallel"] == 4
        results: list[str] = []
        started = threading.Barrier(5)

        def stream() -> None:
            payload = json.dumps(LONG).encode()
            sock = socket.create_connection(("127.0.0.1", node.api_port), timeout=120)
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
            )
            data = b""
            while b"data: " not in data:  # the first event: this stream is generating
                chunk = sock.recv(65536)
                assert chunk, data
                data += chunk
            started.wait(120)
            while not data.endswith(b"0\r\n\r\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            sock.close()
            results.append(data.decode("utf-8", "replace"))

        threads = [threading.Thread(target=stream) for _ in range(4)]
        for t in threads:
            t.start()
        started.wait(120)
        node.wait_status(lambda s: s["models"][0]["in_flight"] == 4, what="four streams in the batch")
        # the runner's stats frames reach /api/status: four sequences decoding together, no slot free
        es = node.wait_status(
            lambda s: (s["models"][0]["engine_stats"] or {}).get("active") == 4,
            what="engine stats with four active sequences",
        )["models"][0]["engine_stats"]
        assert (es["n_slots"], es["free_slots"], es["batch_last"]) == (4, 0, 4), es
        assert 0 < es["kv_used"] <= es["kv_budget"] and es["decode_tokens_per_s"] > 0 and es["steps"] > 0, es
        pid = node.runner_pid()
        os.kill(pid, signal.SIGKILL)
        for t in threads:
            t.join(120)
        assert len(results) == 4
        for body in results:
            assert '"error"' in body and "runner" in body, body[-300:]
            assert body.endswith("0\r\n\r\n")  # the chunked body was terminated properly
        node.wait_status(
            lambda s: s["models"][0]["state"] == "ready" and s["models"][0]["pid"] != pid,
            timeout=90,
            what="runner restarted",
        )
        code, body = request(
            "POST",
            node.api_port,
            "/v1/completions",
            {"model": BUNDLED_MODEL_ID, "prompt": "Hello", "max_tokens": 4, "temperature": 0},
        )
        assert code == 200, body
        assert json.loads(body)["usage"]["completion_tokens"] == 4
        # the new child's figures only (the killed one's were dropped), sent once it went idle again
        es = node.wait_status(
            lambda s: (s["models"][0]["engine_stats"] or {}).get("active") == 0, what="engine stats after the request"
        )["models"][0]["engine_stats"]
        assert es["free_slots"] == 4 and es["batch_last"] == 1 and es["prefix_hits"] + es["prefix_misses"] == 1, es
        assert es["prefill_tokens_per_s"] > 0 and es["steps"] >= 4, es
        code, metrics = request("GET", node.console_port, "/metrics")
        assert code == 200 and f'hydra_engine_free_slots{{model="{BUNDLED_MODEL_ID}"}} 4.0' in metrics, metrics[-2000:]
    finally:
        node.kill_all()
