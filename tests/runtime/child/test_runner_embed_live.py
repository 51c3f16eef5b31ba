"""The runner child's embeddings with the real bundled model, in the real engine loop (no process):
bounded steps that interleave with a running generation, a cancel that drops a waiting request,
unit vectors equal to those of a request embedded alone."""

from __future__ import annotations

import math
import queue

import pytest

from hydra_node.inference import EmbeddingRequest, vector_floats
from hydra_node.runtime.child.embed import EMBED_SEQ_MAX, Embedder
from hydra_node.runtime.child.engine_loop import run_engine_loop, work_queue_bound

pytestmark = pytest.mark.live

TEXTS = tuple(f"Sentence number {i} is about the weather in spring." for i in range(10))


@pytest.fixture(scope="module")
def llm_engine(model_path):
    import llama_cpp

    from hydra_node.runtime.child.engine.batch import BatchEngine

    llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=1024, n_batch=256, verbose=False)
    eng = BatchEngine(llm, n_slots=2, prompt_cache=False, send=lambda m: None)
    yield llm, eng
    eng.close()


def run_loop(llm, eng, msgs: list[dict], ends: int) -> list[dict]:
    """Feed ``msgs`` to the engine loop with an embedder; stop once ``ends`` requests have ended."""
    work: queue.Queue = queue.Queue(work_queue_bound(eng.n_slots))
    frames: list[dict] = []
    ended: set[int] = set()

    def send(m: dict) -> None:
        frames.append(m)
        if m["op"] in ("done", "embedded", "error"):
            ended.add(m["id"])
            if len(ended) == ends:
                work.put(None)

    eng.send = send
    for m in msgs:
        work.put(m)
    assert (
        run_engine_loop(
            eng,
            work,
            lambda req: llm.tokenize(req["prompt"].encode()),
            send,
            cadence=None,
            embed=Embedder.for_llama(llm, send),
        )
        == 0
    )
    return frames


def test_embedding_steps_interleave_with_a_running_generation(llm_engine):
    llm, eng = llm_engine
    gen = {
        "op": "generate",
        "id": 1,
        "req": {"kind": "completion", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.0},
    }
    emb = {"op": "embed", "id": 2, "req": EmbeddingRequest("m", TEXTS).to_wire()}
    frames = run_loop(llm, eng, [gen, emb], ends=2)
    order = [(f["op"], f["id"]) for f in frames if f["op"] in ("delta", "vectors", "done", "embedded")]
    vec_at = [i for i, (op, _) in enumerate(order) if op == "vectors"]
    assert len(vec_at) >= math.ceil(len(TEXTS) / EMBED_SEQ_MAX)
    assert any(op == "delta" for op, _ in order[vec_at[0] : vec_at[-1]]), "the generation waited for the whole batch"
    vectors = [v for f in frames if f["op"] == "vectors" for v in f["v"]]
    assert len(vectors) == len(TEXTS)
    end = next(f for f in frames if f["op"] == "embedded")
    assert end["prompt_tokens"] == sum(len(llm.tokenize(t.encode())) for t in TEXTS)
    for v in vectors:
        assert abs(math.sqrt(sum(x * x for x in vector_floats(v))) - 1.0) < 1e-5
    # a vector does not depend on the inputs it was decoded with
    alone = run_loop(llm, eng, [{"op": "embed", "id": 3, "req": EmbeddingRequest("m", TEXTS[5:6]).to_wire()}], 1)
    u, w = vector_floats(alone[0]["v"][0]), vector_floats(vectors[5])
    assert sum(a * b for a, b in zip(u, w)) > 0.9999


def test_a_cancel_drops_a_waiting_embedding(llm_engine):
    llm, eng = llm_engine
    msgs = [
        {"op": "embed", "id": 4, "req": EmbeddingRequest("m", TEXTS).to_wire()},
        {"op": "embed", "id": 5, "req": EmbeddingRequest("m", TEXTS[:1]).to_wire()},
        {"op": "cancel", "id": 4},
    ]
    frames = run_loop(llm, eng, msgs, ends=2)
    assert {"op": "error", "id": 4, "code": "cancelled", "status": 499, "message": "cancelled"} in frames
    assert not any(f["id"] == 4 and f["op"] in ("vectors", "embedded") for f in frames)
    assert [f["op"] for f in frames if f["id"] == 5] == ["vectors", "embedded"]
