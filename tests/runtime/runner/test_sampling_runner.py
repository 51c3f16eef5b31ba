"""Sampling features through a real runner child (the bundled model): with ``continuous_batching =
false`` the runner is the batch engine with one slot, so grammars and logprobs work there too; a
runner with a draft model (speculative decoding) serves them too: only plain greedy requests
speculate, inside the engine."""

from __future__ import annotations

import pytest
import trio

from hydra_node.inference import Finished, GenerationError, GenerationRequest, TextDelta
from hydra_node.models import resolve_model
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from hydra_node.runtime.speculative.runner_args import argv_for

TIMEOUT_S = 300


def completion(**kw) -> GenerationRequest:
    return GenerationRequest(
        model="m", kind="completion", prompt="The capital of France is", max_tokens=6, temperature=0.0, **kw
    )


async def run(sup: RunnerSupervisor, req: GenerationRequest) -> tuple[list[TextDelta], Finished]:
    async with sup.generate(req) as events:
        evs = [ev async for ev in events]
    assert isinstance(evs[-1], Finished)
    return evs[:-1], evs[-1]


async def serve(tmp_path, settings: RunnerSettings, check) -> None:
    sup = RunnerSupervisor(resolve_model(None), tmp_path, settings, node_id="n")
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            await check(sup)
            nursery.cancel_scope.cancel()


async def test_without_continuous_batching_the_one_slot_engine_serves_grammars_and_logprobs(tmp_path) -> None:
    async def check(sup: RunnerSupervisor) -> None:
        engine = sup.status().engine
        assert engine["mode"] == "sequential" and engine["parallel"] == 1 and "one slot" in engine["reason"]
        deltas, fin = await run(sup, completion(grammar='root ::= "yes" | "no"'))
        assert "".join(d.text for d in deltas) in ("yes", "no") and fin.finish_reason == "stop"
        deltas, fin = await run(sup, completion(logprobs=True, top_logprobs=3))
        entries = [e for d in deltas for e in d.logprobs]  # decoded from the runner's frames
        assert len(entries) == fin.completion_tokens == 6 and entries[0].token == " Paris"
        assert all(len(e.top) == 3 and e.top[0][1] >= e.top[2][1] for e in entries)
        assert "".join(e.token for e in entries) == "".join(d.text for d in deltas)
        with pytest.raises(GenerationError) as err:
            await run(sup, completion(grammar='root ::= "unterminated'))
        assert (err.value.status, err.value.code) == (400, "invalid_grammar")
        _, fin = await run(sup, completion())  # still serving
        assert fin.completion_tokens == 6 and sup.restarts == 0

    await serve(tmp_path, RunnerSettings(n_ctx=1024, continuous_batching=False, warmup=False), check)


async def test_a_speculative_runner_serves_every_sampling_feature_in_the_engine(tmp_path) -> None:
    draft = argv_for(model=str(resolve_model(None).path))  # the same model as its own draft: same vocabulary

    async def check(sup: RunnerSupervisor) -> None:
        engine = sup.status().engine  # speculation runs inside the batch engine (engine/speculation.py)
        assert engine["mode"] == "continuous_batching" and engine["speculation"] == "local"
        for kw in (
            {"grammar": 'root ::= "yes" | "no"'},
            {"logprobs": True},
            {"logit_bias": ((5, 1.0),)},
            {"presence_penalty": 1.0},
            {"frequency_penalty": 1.0},
        ):
            deltas, fin = await run(sup, completion(**kw))  # served, without speculating
            assert fin.completion_tokens >= 1, kw
        deltas, fin = await run(sup, completion())  # a plain greedy request may speculate
        assert "".join(d.text for d in deltas).startswith(" Paris") and fin.completion_tokens == 6
        spec = sup.status().speculative
        assert spec["in_engine"] is True and spec["requests"] == 6

    await serve(tmp_path, RunnerSettings(n_ctx=1024, warmup=False, extra_argv=tuple(draft)), check)
