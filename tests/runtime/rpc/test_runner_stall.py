"""The stall bound: a runner that goes silent mid-generation is killed and the request fails cleanly.

A split runner blocks forever when its RPC worker or tunnel stalls (ggml RPC has no
timeouts); SIGSTOP on the runner itself produces the same silence, with the real model.
"""

from __future__ import annotations

import os
import signal

import pytest
import trio

from hydra_node.inference import GenerationRequest
from hydra_node.models import resolve_model
from hydra_node.runtime.runner.records import RunnerSettings, RunnerStalled
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from waiting import wait_until

STALL_S = 3.0
TIMEOUT_S = 60


async def test_stalled_runner_is_killed_and_restarted(tmp_path) -> None:
    # warmup: a cold runner's first decode (page faults on the mapped weights) can take longer than
    # STALL_S on a loaded machine, and the request after the restart must not be judged stalled for it.
    settings = RunnerSettings(
        n_ctx=512, threads=1, warmup=True, stall_timeout_s=STALL_S, inject_token_delay_ms=20, backoff_initial_s=0.1
    )
    sup = RunnerSupervisor(resolve_model(None), tmp_path, settings, node_id="n")
    req = GenerationRequest.from_wire(
        {
            "model": sup.model.id,
            "kind": "completion",
            "prompt": "Once upon a time",
            "max_tokens": 200,
            "temperature": 0.0,
        }
    )
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            pid = sup.pid
            with pytest.raises(RunnerStalled) as err:
                async with sup.generate(req) as events:
                    async for _ in events:
                        os.kill(pid, signal.SIGSTOP)  # silent from the first token on
            assert err.value.code == "runner_stalled" and err.value.status == 504
            await wait_until(lambda: sup.state == "ready" and sup.pid not in (None, pid), interval_s=0.05)
            assert sup.restarts == 1
            async with sup.generate(GenerationRequest.from_wire({**req.to_wire(), "max_tokens": 4})) as events:
                assert type([e async for e in events][-1]).__name__ == "Finished"
            nursery.cancel_scope.cancel()
