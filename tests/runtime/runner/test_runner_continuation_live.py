"""A real runner child (the bundled model) for a stream's continuation (issue 26 item 1, the runner's part):
the deltas' token ids reach the node's ``TextDelta.tokens``; a request resumed from them through the
supervisor gives the rest of the uninterrupted run with usage counting the original prompt and the
tokens generated there; and a death is classified: a SIGKILL this node did not send (the OOM killer,
kill -9: a lost head) is ``runner_killed``, retryable and not poisonous, while a SIGABRT (what a
request can cause: llama.cpp aborting on it) stays ``runner_crashed``, poisonous."""

from __future__ import annotations

import os
import signal

import pytest
import trio

from hydra_node.inference import Finished, GenerationError, GenerationRequest, TextDelta
from hydra_node.models import resolve_model
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from waiting import wait_until

TIMEOUT_S = 240


def chat(text: str, **kw) -> GenerationRequest:
    return GenerationRequest(model="m", kind="chat", messages=(("user", text),), temperature=0.0, **kw)


async def run(sup: RunnerSupervisor, req: GenerationRequest) -> tuple[list[TextDelta], Finished]:
    async with sup.generate(req) as events:
        evs = [ev async for ev in events]
    assert all(isinstance(e, TextDelta) for e in evs[:-1]) and isinstance(evs[-1], Finished), evs
    return evs[:-1], evs[-1]  # type: ignore[return-value]


async def killed_mid_stream(sup: RunnerSupervisor, sig: int) -> GenerationError:
    pid = sup.pid
    assert pid is not None
    long = GenerationRequest(model="m", kind="completion", prompt="1, 2, 3, 4,", max_tokens=400, temperature=0.0)
    with pytest.raises(GenerationError) as err:
        async with sup.generate(long) as events:
            async for _ in events:
                os.kill(pid, sig)  # from outside, once the stream is running
    await wait_until(lambda: sup.state == "ready" and sup.pid not in (None, pid), interval_s=0.05)
    return err.value


async def test_delta_tokens_a_resume_and_how_a_death_is_classified(tmp_path) -> None:
    # one slot: each request starts from an empty KV cache (its occupancy can change greedy's last bits)
    settings = RunnerSettings(n_ctx=512, threads=1, warmup=True, inject_token_delay_ms=5, backoff_initial_s=0.1)
    sup = RunnerSupervisor(resolve_model(None), tmp_path, settings, node_id="n")
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            req = chat("Say hello in Japanese and Chinese.", max_tokens=16)
            deltas, fin = await run(sup, req)
            ids = [t for d in deltas for t in d.tokens]
            assert len(ids) == fin.completion_tokens == 16 and all(d.tokens for d in deltas)
            k = len(deltas[0].tokens) + len(deltas[1].tokens)  # a router got two deltas, then lost the host
            resumed = chat(
                "Say hello in Japanese and Chinese.",
                max_tokens=16 - k,
                resume_tokens=tuple(ids[:k]),
                resume_skip=len(deltas[0].text + deltas[1].text),
            )
            more, fin2 = await run(sup, resumed)
            assert deltas[0].text + deltas[1].text + "".join(d.text for d in more) == "".join(d.text for d in deltas)
            assert [t for d in more for t in d.tokens] == ids[k:]
            assert (fin2.prompt_tokens, fin2.completion_tokens, fin2.finish_reason) == (
                fin.prompt_tokens,
                16 - k,
                "length",
            )

            lost = await killed_mid_stream(sup, signal.SIGKILL)
            assert (lost.code, lost.status, lost.retryable, lost.poisonous) == ("runner_killed", 502, True, False), lost
            crashed = await killed_mid_stream(sup, signal.SIGABRT)
            assert (crashed.code, crashed.poisonous) == ("runner_crashed", True), crashed
            assert "signal 6" in crashed.message
            assert sup.restarts == 2
            nursery.cancel_scope.cancel()
