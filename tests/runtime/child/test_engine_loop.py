"""The runner child's engine loop: frames in order, cancels routed, failures contained (no llama.cpp)."""

from __future__ import annotations

import queue

from hydra_node.runtime.child.engine_loop import run_engine_loop, work_queue_bound


class RecordingEngine:
    """The loop's view of the engine: busy for ``steps`` steps after each submit."""

    def __init__(self, fail_on_step: int = -1):
        self.log: list[tuple] = []
        self.busy = 0
        self.steps = 0
        self.fail_on_step = fail_on_step

    @property
    def idle(self) -> bool:
        return self.busy == 0

    def submit(self, rid, req, tokens, clock):
        self.log.append(("submit", rid, tuple(tokens)))
        self.busy += 2

    def cancel(self, rid):
        self.log.append(("cancel", rid))

    def step(self):
        self.steps += 1
        self.busy -= 1
        if self.steps == self.fail_on_step:
            raise ValueError("boom")

    def fail_all(self, message):
        self.log.append(("fail_all", message))
        self.busy = 0


def test_frames_reach_the_engine_in_order_and_the_loop_ends_with_the_channel():
    work: queue.Queue = queue.Queue(work_queue_bound(2))
    for m in (
        {"op": "generate", "id": 1, "req": {"prompt": "ab"}},
        {"op": "cancel", "id": 1},
        {"op": "generate", "id": 2, "req": {"prompt": "c"}},
        None,
    ):
        work.put(m)
    eng, sent = RecordingEngine(), []
    assert run_engine_loop(eng, work, lambda req: [ord(c) for c in req["prompt"]], sent.append) == 0
    assert eng.log == [("submit", 1, (97, 98)), ("cancel", 1), ("submit", 2, (99,))]
    assert sent == []


def test_a_prompt_that_cannot_be_tokenised_gets_an_error_frame():
    work: queue.Queue = queue.Queue(8)
    work.put({"op": "generate", "id": 7, "req": {}})
    work.put(None)
    sent: list[dict] = []
    run_engine_loop(RecordingEngine(), work, lambda req: req["prompt"], sent.append)
    assert sent[0]["id"] == 7 and sent[0]["code"] == "runner_error" and "KeyError" in sent[0]["message"]


def test_a_failing_step_fails_the_batch_and_the_loop_keeps_serving():
    work: queue.Queue = queue.Queue(8)
    work.put({"op": "generate", "id": 1, "req": {"prompt": "a"}})
    eng = RecordingEngine(fail_on_step=1)
    orig = eng.fail_all

    def fail_all(message):
        orig(message)
        work.put({"op": "generate", "id": 2, "req": {"prompt": "b"}})
        work.put(None)

    eng.fail_all = fail_all
    assert run_engine_loop(eng, work, lambda req: [1], lambda m: None) == 0
    assert ("fail_all", "ValueError: boom") in eng.log and eng.log[-1] == ("submit", 2, (1,))
