"""The model runner's state table (records.RUNNER_TRANSITIONS) and the supervisor's state setter."""

from __future__ import annotations

import pytest

from hydra_node.models import resolve_model
from hydra_node.runtime.runner.records import RUNNER_TRANSITIONS, RunnerSettings, RunnerState
from hydra_node.runtime.runner.supervisor import RunnerSupervisor
from hydra_node.statemachine import InvalidTransition

R = RunnerState

#: The paths the supervisor and its host take (supervisor.py, hosting/hosted_model.py).
LIVES = [
    [R.LOADING, R.READY, R.RESTARTING, R.LOADING, R.READY, R.RESTARTING, R.STOPPED],  # a crash, then a stop
    [R.PLACING, R.LOADING, R.READY, R.RESTARTING, R.PLACING, R.LOADING],  # a split replans before every spawn
    [R.LOADING, R.READY, R.RESTARTING, R.FAILED, R.LOADING, R.PLACING],  # crash loop, retried after failed_retry_s
    [R.LOADING, R.RESTARTING, R.STOPPED, R.PLACING, R.LOADING, R.RESTARTING, R.STOPPED, R.FAILED],  # split load retries
    [R.PLACING, R.FAILED, R.STOPPED],  # crash loop while placing, then cancelled
]


def supervisor(tmp_path) -> RunnerSupervisor:
    return RunnerSupervisor(resolve_model(None), tmp_path, RunnerSettings(), node_id="n")


def test_every_state_has_a_row_and_stopped_and_failed_are_reachable_from_anywhere() -> None:
    assert set(RUNNER_TRANSITIONS) == set(RunnerState)
    for state, targets in RUNNER_TRANSITIONS.items():
        assert state not in targets  # the same state is no move (the setter ignores it)
        assert {R.STOPPED, R.FAILED} - {state} <= targets


@pytest.mark.parametrize("life", LIVES)
def test_the_lives_the_supervisor_and_its_host_lead_are_in_the_table(tmp_path, life) -> None:
    sup = supervisor(tmp_path)
    seen: list[tuple[RunnerState, RunnerState]] = []
    sup.on_state = lambda s, old: seen.append((old, s.state))
    for state in life:
        sup.state = state
    assert sup.state is life[-1]
    assert seen == list(zip([R.STARTING, *life], life))


def test_the_same_state_again_is_no_move_and_reports_nothing(tmp_path) -> None:
    sup = supervisor(tmp_path)
    seen: list[RunnerState] = []
    sup.on_state = lambda s, old: seen.append(old)
    sup.state = R.PLACING
    sup.state = R.PLACING
    assert seen == [R.STARTING]


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (R.STARTING, R.READY),
        (R.PLACING, R.READY),
        (R.READY, R.LOADING),
        (R.FAILED, R.RESTARTING),
        (R.STOPPED, R.READY),
        (R.RESTARTING, R.READY),
    ],
)
def test_a_move_not_in_the_table_raises_and_leaves_the_state(tmp_path, start, to) -> None:
    sup = supervisor(tmp_path)
    sup._state = start
    seen: list[RunnerState] = []
    sup.on_state = lambda s, old: seen.append(old)
    with pytest.raises(InvalidTransition) as info:
        sup.state = to
    assert (info.value.machine, info.value.state, info.value.event) == ("model runner", start, to)
    assert sup.state is start and seen == []
