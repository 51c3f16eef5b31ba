"""A request that cannot be sent to a runner is that request's error (400), never a reason to kill
the runner (issue 14 item 3): before, the supervisor waited for a cancel the child never got and
SIGKILLed the runner after 5 s; five such requests left the model failed."""

from __future__ import annotations

import pytest
import trio

from hydra_node.inference import GenerationError, GenerationRequest
from hydra_node.models import resolve_model
from hydra_node.runtime.runner.records import RunnerSettings
from hydra_node.runtime.runner.supervisor import RunnerSupervisor

TIMEOUT_S = 60


async def test_an_unencodable_request_is_a_400_and_the_runner_lives_on(tmp_path) -> None:
    settings = RunnerSettings(n_ctx=512, threads=1, warmup=False, backoff_initial_s=0.1)
    sup = RunnerSupervisor(resolve_model(None), tmp_path, settings, node_id="n")
    good = GenerationRequest.from_wire(
        {"model": sup.model.id, "kind": "completion", "prompt": "Hello", "max_tokens": 2, "temperature": 0.0}
    )
    bad = GenerationRequest.from_wire(good.to_wire())
    object.__setattr__(bad, "prompt", "\ud800")  # what validation refuses today, as a bug would let through
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            pid = sup.pid
            for _ in range(6):  # more than the crash-loop limit
                with pytest.raises(GenerationError) as err:
                    async with sup.generate(bad) as events:
                        async for _ in events:
                            pass
                assert err.value.status == 400 and err.value.code == "unencodable_request"
            assert sup.pid == pid and sup.restarts == 0 and sup.state == "ready" and sup.in_flight == 0
            async with sup.generate(good) as events:
                assert type([e async for e in events][-1]).__name__ == "Finished"
            nursery.cancel_scope.cancel()
