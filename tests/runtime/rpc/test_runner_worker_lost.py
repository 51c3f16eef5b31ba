"""A real runner's supervisor asks its host whether a split worker was lost when the runner dies or
stalls (``RunnerSupervisor(lost_worker=...)``; docs/splits.md "Supervision").

The host's answer is what ``HostedModel`` gives (its ``_lost_worker``: a lease that ended, a peer
that is not alive); here the test gives it, so that each case runs on the real model without a mesh:
a stall (SIGSTOP) with a worker lost → ``split_worker_lost``, not ``runner_stalled``; an abort
(SIGABRT, what ggml-rpc does when its worker's socket closes) with every worker alive →
``runner_crashed``. A death with a worker lost is the live heal (test_split_heal_live.py).
"""

from __future__ import annotations

import os
import signal

import pytest
import trio

from hydra_node.inference import GenerationError, GenerationRequest
from hydra_node.models import resolve_model
from hydra_node.runtime.runner.records import RunnerSettings, WorkerLoss
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from waiting import wait_until

STALL_S = 3.0
TIMEOUT_S = 90
LOSS = WorkerLoss("cd" * 32, "its lease ended: link closed", 1_764_000_000.0)


async def test_a_runner_that_lost_its_split_worker_fails_its_request_with_split_worker_lost(tmp_path) -> None:
    settings = RunnerSettings(
        n_ctx=512, threads=1, warmup=True, stall_timeout_s=STALL_S, inject_token_delay_ms=20, backoff_initial_s=0.1
    )
    lost: list[WorkerLoss | None] = [LOSS]
    asked = 0

    async def lost_worker() -> WorkerLoss | None:
        nonlocal asked
        asked += 1
        return lost[0]

    sup = RunnerSupervisor(resolve_model(None), tmp_path, settings, node_id="n", lost_worker=lost_worker)
    req = GenerationRequest.from_wire(
        {"model": sup.model.id, "kind": "completion", "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0}
    )

    async def failure(sig: signal.Signals) -> GenerationError:
        await wait_until(lambda: sup.state == "ready", interval_s=0.05)
        pid = sup.pid
        assert pid is not None
        with pytest.raises(GenerationError) as err:
            async with sup.generate(req) as events:
                async for _ in events:
                    os.kill(pid, sig)  # from the first token on
        await wait_until(lambda: sup.state == "ready" and sup.pid not in (None, pid), interval_s=0.05)
        return err.value

    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            stalled = await failure(signal.SIGSTOP)
            assert (stalled.code, stalled.status, stalled.retryable) == ("split_worker_lost", 502, True)
            assert "produced nothing for 3 s" in stalled.message and LOSS.peer[:16] in stalled.message
            lost[0] = None  # every worker alive: the runner's own crash
            crashed = await failure(signal.SIGABRT)
            assert crashed.code == "runner_crashed" and crashed.poisonous
            assert asked == 2 and sup.restarts == 2
            nursery.cancel_scope.cancel()
