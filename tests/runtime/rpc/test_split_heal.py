"""Which death a split runner's requests get, and what a heal reports (pure; no model, no process).

A runner that died because its split lost a worker gives its requests ``split_worker_lost`` (502,
retryable, continuable: a lost head); one that died with every worker alive stays
``runner_crashed`` (poisonous: the request may have killed it), and a SIGKILL the node did not send
``runner_killed``. The live story is test_split_heal_live.py; docs/splits.md "When a worker dies or stalls".
"""

from __future__ import annotations

import signal

import pytest

from hydra_node.routing.continuation import CONTINUABLE_CODES, Continuation
from hydra_node.inference import GenerationRequest
from hydra_node.runtime.rpc.heal import Replan, replan_kind
from hydra_node.runtime.runner.records import (
    RunnerCrashed,
    RunnerKilled,
    SplitWorkerLost,
    WorkerLoss,
    death_error,
)

MODEL = "split-model"
PEER = "ab" * 32
LOSS = WorkerLoss(PEER, "its lease ended: link closed", 1_764_000_000.0)


@pytest.mark.parametrize("exit_code", [-signal.SIGABRT, -signal.SIGKILL, 1, None])
@pytest.mark.parametrize("we_killed", [False, True])
def test_a_runner_that_lost_a_worker_fails_its_requests_with_split_worker_lost(exit_code, we_killed):
    err = death_error(MODEL, exit_code, we_killed=we_killed, loss=LOSS)
    assert isinstance(err, SplitWorkerLost)
    assert (err.code, err.status, err.retryable, err.poisonous) == ("split_worker_lost", 502, True, False)
    assert PEER[:16] in err.message and repr(MODEL) in err.message and "lease ended" in err.message
    assert err.code in CONTINUABLE_CODES


def test_the_router_continues_a_split_worker_lost_failure():
    progress = Continuation(GenerationRequest(MODEL, "completion", prompt="hi", max_tokens=8, temperature=0.0))
    progress.start_part("coordinator")
    progress.failed_part()
    assert progress.decide(death_error(MODEL, -signal.SIGABRT, we_killed=False, loss=LOSS)).continues
    assert not progress.decide(death_error(MODEL, -signal.SIGABRT, we_killed=False, loss=None)).continues


@pytest.mark.parametrize(
    ("exit_code", "we_killed", "expected"),
    [
        (-signal.SIGABRT, False, RunnerCrashed),  # ggml-rpc aborts: with every worker alive, the runner's own
        (1, False, RunnerCrashed),
        (None, False, RunnerCrashed),
        (-signal.SIGKILL, True, RunnerCrashed),  # the node's own kill of a stuck runner
        (-signal.SIGKILL, False, RunnerKilled),  # the OOM killer, an operator
    ],
)
def test_a_runner_that_died_with_every_worker_alive_is_not_a_lost_worker(exit_code, we_killed, expected):
    err = death_error(MODEL, exit_code, we_killed=we_killed, loss=None)
    assert type(err) is expected
    assert err.code != "split_worker_lost"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ((PEER,), (), Replan.LOCAL),
        ((PEER, "w2"), ("w2",), Replan.FEWER),
        ((PEER,), ("w3",), Replan.REPLACEMENT),
        ((PEER, "w2"), ("w2", "w3"), Replan.REPLACEMENT),
        ((PEER,), (PEER,), Replan.SAME),
    ],
)
def test_the_replan_is_named_by_what_took_the_lost_workers_layers(old, new, expected):
    assert replan_kind(old, PEER, new) is expected
