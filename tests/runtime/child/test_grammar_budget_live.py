"""A grammar that makes llama.cpp's grammar engine slow fails ITS request, not the runner (a real
runner child, the bundled model): ``^([a-z]|[a-z]|...)*$`` with 64 alternatives (the most the
pattern checks let through) costs hundreds of ms per token (every alternative is a parse stack,
re-entered at each character).  Past ``grammar_token_budget_ms`` the request gets a 422 ``grammar_too_slow``; a request
beside it in the batch finishes, the runner serves the next one, same process, no restart."""

from __future__ import annotations

import pytest
import trio

from hydra_node.grammar.constraints import json_schema_grammar
from hydra_node.grammar.regex import MAX_REPEATED_ALTERNATIVES
from hydra_node.inference import Finished, GenerationError, GenerationRequest
from hydra_node.models import resolve_model
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor

pytestmark = pytest.mark.live

TIMEOUT_S = 300
#: Passes the pattern checks (no nullable repetition, one unbounded repetition, MAX_REPEATED_ALTERNATIVES
#: alternatives); a token of a few characters takes hundreds of ms of grammar work on a 2-core CPU.
SLOW_PATTERN = "^(" + "|".join(["[a-z]"] * MAX_REPEATED_ALTERNATIVES) + ")*$"


def completion(**kw) -> GenerationRequest:
    return GenerationRequest(model="m", kind="completion", prompt="Write a word:", temperature=0.0, **kw)


async def finished(sup: RunnerSupervisor, req: GenerationRequest) -> Finished:
    async with sup.generate(req) as events:
        evs = [ev async for ev in events]
    assert isinstance(evs[-1], Finished)
    return evs[-1]


async def test_a_grammar_past_its_budget_fails_its_request_and_the_runner_goes_on(tmp_path) -> None:
    grammar = json_schema_grammar({"type": "string", "pattern": SLOW_PATTERN}, param="response_format")
    settings = RunnerSettings(n_ctx=1024, parallel=2, warmup=False, grammar_token_budget_ms=5)
    sup = RunnerSupervisor(resolve_model(None), tmp_path, settings, node_id="n")
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            pid = sup.pid
            beside: list[Finished] = []

            async def plain() -> None:
                beside.append(await finished(sup, completion(max_tokens=24)))

            async with trio.open_nursery() as both:  # the slow one and a plain one in the same batch
                both.start_soon(plain)
                with pytest.raises(GenerationError) as err:
                    await finished(sup, completion(max_tokens=8, grammar=grammar))
            assert (err.value.status, err.value.code) == (422, "grammar_too_slow"), err.value
            assert "grammar_token_budget_ms" in err.value.message
            assert not err.value.retry_elsewhere  # the router does not try it on another node
            assert beside[0].completion_tokens == 24 and beside[0].finish_reason == "length"
            fin = await finished(sup, completion(max_tokens=4))  # still serving, same process
            assert fin.completion_tokens == 4
            assert sup.pid == pid and sup.restarts == 0
            nursery.cancel_scope.cancel()
